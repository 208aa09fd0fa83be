"""The checks the matrix-state ops (linear attention, gated linear attention, the gated delta rule) get on their case
tables (each op's test file holds its table; tests/ops/cases.py is the same design for power retention).

An op is described by `Op`: its full op, its step and its float64 token recurrence, the kind of gate it takes and
whether it takes beta. Token arrays are (q, k, v, *extras) with extras (log_g,) or (beta, log_g). For a case:
- `check_chunked`: the chunked op, compiled once with the gradients of <o, ct_o> + <S, ct_S> with respect to every
  token array and the initial state, against the recurrence in float64 (outputs, final state, gradients); a
  packed case runs packed with segment_ids and its oracle runs each document alone (`cases.separately`);
- `check_steps`: the decode step fed all but the last 4 tokens, then 1, then 3 (a row whose piece starts a
  document starts it from an empty state, as a mixer does), against the oracle's rows and final state;
- `check_bf16`: `check_chunked` with bf16 q, k and v, against the recurrence in float64 on those rounded inputs,
  within BF16_TOL.
"""

import dataclasses
import functools
import zlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention import init_matrix_state
from tests.helpers import f64, rel_err
from tests.ops.cases import BF16_TOL, F32_TOL, separately
from tests.ops.cases import segment_ids as case_segment_ids


@dataclasses.dataclass(frozen=True)
class Op:
    """full(*tokens, segment_ids, chunk_size, initial_state, return_state); step(state, *tokens, segment_ids);
    recurrence(*tokens, initial_state, segment_ids); gate "scalar" ([B, T, H]) or "channel" ([B, T, H, d_k])."""

    name: str
    full: Callable
    step: Callable
    recurrence: Callable
    gate: str
    beta: bool = False


@dataclasses.dataclass(frozen=True)
class Case:
    """gate None (no log_g), "weak" (log-gates in [-0.1, 0]) or "strong" (in [-20, 0]); beta "low" ([0, 0.05]) or
    "high" ([0.95, 1]); init: start from a random state; docs: per row, the packed documents' lengths."""

    T: int
    Hq: int
    H: int
    d_k: int
    d_v: int
    gate: str | None
    chunk: int
    init: bool = False
    beta: str = "high"
    B: int = 2
    docs: tuple | None = None

    @property
    def id(self) -> str:
        packed = "" if self.docs is None else f"-{sum(map(len, self.docs))}docs"
        init = "-init" if self.init else ""
        shape = f"T{self.T}-Hq{self.Hq}-H{self.H}-dk{self.d_k}-dv{self.d_v}"
        return f"{shape}-{self.gate}-beta_{self.beta}-c{self.chunk}{init}{packed}"


def params(cases, slow=()) -> list:
    """pytest params (case, id=case.id), each case's tests in one xdist group (its inputs and oracle made once); the
    cases in `slow` (further cases of what the others check) marked slow too."""
    marks = lambda case: [pytest.mark.xdist_group(case.id)] + ([pytest.mark.slow] if case in slow else [])
    return [pytest.param(case, id=case.id, marks=marks(case)) for case in cases]


@functools.cache
def inputs(op: Op, case: Case):
    """((q, k, v, *extras), state0 or None), float32, fresh per case: q, v standard normal; k unit-norm for the
    delta rule (its stable range), else standard normal; the state standard normal / 2."""
    rng = np.random.default_rng(zlib.crc32(f"{op.name}-{case.id}".encode()))
    B, T, H = case.B, case.T, case.H
    normal = lambda *shape: rng.standard_normal(shape)
    q, k, v = normal(B, T, case.Hq, case.d_k), normal(B, T, H, case.d_k), normal(B, T, H, case.d_v)
    if op.beta:
        k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    gate_shape = (B, T, H, case.d_k) if op.gate == "channel" else (B, T, H)
    low = {None: None, "weak": -0.1, "strong": -20.0}[case.gate]
    log_g = None if low is None else rng.uniform(low, 0.0, gate_shape)
    extras = (log_g,)
    if op.beta:
        extras = (rng.uniform(*{"low": (0.0, 0.05), "high": (0.95, 1.0)}[case.beta], (B, T, H)), log_g)
    as32 = lambda x: None if x is None else jnp.asarray(x, jnp.float32)
    state0 = as32(normal(B, H, case.d_k, case.d_v) / 2) if case.init else None
    return tuple(map(as32, (q, k, v, *extras))), state0


@functools.cache
def cotangents(case: Case):
    rng = np.random.default_rng(zlib.crc32(case.id.encode()) + 1)
    shapes = [(case.B, case.T, case.Hq, case.d_v), (case.B, case.H, case.d_k, case.d_v)]
    return tuple(jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in shapes)


def _dot(x, ct):
    acc = jnp.promote_types(x.dtype, jnp.float32)
    return jnp.vdot(x.astype(acc), ct.astype(acc))


def differentiate(case: Case, path, tokens, state0, segment_ids=None):
    """Compiled (o, final state, gradients by position: the non-None tokens, then the initial state) of
    <o, ct_o> + <S, ct_S> for path(*tokens, state0, segment_ids=...)."""
    ct_o, ct_S = cotangents(case)
    given = [x for x in tokens if x is not None] + ([state0] if state0 is not None else [])

    def loss(*xs):
        it = iter(xs)
        toks = tuple(None if x is None else next(it) for x in tokens)
        s0 = None if state0 is None else next(it)
        o, S = path(*toks, s0) if segment_ids is None else path(*toks, s0, segment_ids=segment_ids)
        return _dot(o, ct_o) + _dot(S, ct_S), (o, S)

    grad = jax.value_and_grad(loss, argnums=tuple(range(len(given))), has_aux=True)
    (_, (o, S)), grads = jax.jit(grad)(*given)
    return o, S, grads


@functools.cache
def oracle(op: Op, case: Case, bf16: bool = False):
    """(o, state, gradients) of the float64 recurrence; a packed case's documents run one by one (with `bf16`: on
    q, k and v rounded to bf16)."""
    tokens, state0 = inputs(op, case)
    if bf16:
        tokens = tuple(x.astype(jnp.bfloat16) for x in tokens[:3]) + tokens[3:]
    tokens64, state64 = f64(*tokens), None if state0 is None else f64(state0)[0]
    path = op.recurrence if case.docs is None else separately(case, op.recurrence)
    return differentiate(case, path, tokens64, state64)


def _compare(got: dict, want: dict, tol: float = F32_TOL) -> None:
    """Relative errors under tol; a wanted value that is exactly zero (the gate of a first token, which multiplies
    an empty state) is compared absolutely, against the size of the output's."""
    size = float(np.linalg.norm(np.asarray(want["o"], np.float64)))
    error = lambda a, b: rel_err(a, b) if np.any(np.asarray(b) != 0) else float(np.linalg.norm(np.asarray(a))) / size
    errors = {name: error(got[name], want[name]) for name in got}
    bad = {name: e for name, e in errors.items() if not e < tol}  # NaN fails
    assert not bad, f"relative errors over {tol}: {bad} (all: {errors})"


def check_chunked(op: Op, case: Case, *, bf16: bool = False) -> None:
    """The chunked op's outputs, final state and every gradient against the float64 recurrence (with `bf16`: q, k
    and v in bf16, the oracle on the same rounded values, within BF16_TOL)."""
    tokens, state0 = inputs(op, case)
    if bf16:
        tokens = tuple(x.astype(jnp.bfloat16) for x in tokens[:3]) + tokens[3:]

    def path(*args, segment_ids=None):
        *toks, s0 = args
        options = dict(chunk_size=case.chunk, initial_state=s0, return_state=True)
        return op.full(*toks, segment_ids=segment_ids, **options)

    o, S, grads = differentiate(case, path, tokens, state0, case_segment_ids(case))
    o_want, S_want, grads_want = oracle(op, case, bf16)
    assert o.dtype == tokens[2].dtype and o.shape == (case.B, case.T, case.Hq, case.d_v)
    assert S.dtype == jnp.float32 and S.shape == (case.B, case.H, case.d_k, case.d_v)
    names = [n for n, x in zip(["q", "k", "v"] + (["beta"] if op.beta else []) + ["log_g"], tokens) if x is not None]
    names += ["state0"] if state0 is not None else []
    got = {"o": o, "S": S} | {f"d{n}": g for n, g in zip(names, grads)}
    want = {"o": o_want, "S": S_want} | {f"d{n}": g for n, g in zip(names, grads_want)}
    _compare(got, want, BF16_TOL if bf16 else F32_TOL)


def pieces(T: int) -> list[tuple[int, int]]:
    """All but the last 4 tokens, then 1, then 3 (for T <= 4: one token, then the rest)."""
    cuts = [0, T - 4, T - 3, T] if T > 4 else [0, 1, T]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def check_steps(op: Op, case: Case) -> None:
    """The step fed `pieces(T)` in turn equals the oracle's rows and its final state."""
    tokens, state0 = inputs(op, case)
    ids = case_segment_ids(case)
    step = jax.jit(op.step)
    state = init_matrix_state(case.B, case.H, case.d_k, case.d_v) if state0 is None else state0
    outputs = []
    for a, b in pieces(case.T):
        piece = lambda x, a=a, b=b: None if x is None else x[:, a:b]
        if ids is not None and a > 0:  # rows whose piece starts a document start it from an empty state
            state = jnp.where((ids[:, a] != ids[:, a - 1])[:, None, None, None], 0.0, state)
        o, state = step(state, *map(piece, tokens), segment_ids=piece(ids))
        outputs.append(o)
    o_want, S_want, _ = oracle(op, case)
    _compare({"o": jnp.concatenate(outputs, axis=1), "S": state}, {"o": o_want, "S": S_want})
