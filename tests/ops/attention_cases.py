"""The one case table of softmax attention, its float64 oracle, and the check every path gets on it.

A path is a function (q, k, v, segment_ids) -> y [B, T, Hq, d] at the default scale d^-1/2, segment_ids None for
a case without documents. `check_attention_path` runs it compiled, with the gradients of <y, ct> with respect to
q, k and v, and compares output and gradients in float64 against `dense_oracle`: causal softmax attention (within
the window) written out from its definition here, sharing no code with the op. Packed cases (`docs`: each row's
document lengths) run the path on the packed sequence with their segment ids and the oracle on each document
alone (`cases.separately`: every document its own batch row), so outputs and gradients are those of the documents
run one by one. Paths run the cases they support (`case_ids` filters by a predicate) and say which in their files.
"""

import dataclasses
import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from einops import rearrange

from tests.helpers import f64, rel_err
from tests.ops.cases import BF16_TOL, F32_TOL, case_marks, segment_ids, separately


@dataclasses.dataclass(frozen=True)
class Case:
    """One configuration: window None (full causal attention) or the tokens a query sees; block: the blockwise
    kernel's block size (None: the op's default, one block for these lengths)."""

    T: int
    Hq: int
    H: int
    d: int
    window: int | None
    block: int | None
    dtype: str = "float32"
    B: int = 2
    docs: tuple | None = None  # packed: per row, the document lengths (summing to T)
    slow: bool = False  # a further case of what the quick ones check: its tests are marked slow (make test-all)

    @property
    def id(self) -> str:
        packed = "" if self.docs is None else f"-{sum(map(len, self.docs))}docs"
        return f"T{self.T}-Hq{self.Hq}-H{self.H}-d{self.d}-w{self.window}-b{self.block}-{self.dtype}{packed}"

    @property
    def tol(self) -> float:
        return F32_TOL if self.dtype == "float32" else BF16_TOL


CASES = [
    Case(1, 2, 1, 8, None, 16),  # one token: dq = dk = 0
    Case(37, 4, 2, 16, None, 16),  # odd T over 3 blocks, GQA
    Case(64, 2, 2, 8, 9, 16),  # a window shorter than a block, crossing block edges (a 9-slot ring buffer)
    Case(45, 4, 1, 8, 1, 16),  # window 1: each query sees its own key only (dq = dk = 0); 4 query heads a kv-head
    Case(52, 2, 1, 16, 80, 32, slow=True),  # a window longer than T: full attention
    Case(68, 4, 2, 8, 20, 32, slow=True),  # a window spanning a block edge, 3 blocks, the last part padding
    Case(40, 4, 2, 16, None, None, dtype="bfloat16"),  # the default block
    Case(33, 2, 1, 8, 6, 16, dtype="bfloat16", slow=True),
    # packed: documents of length 1, one starting exactly on a block edge (16), one across one; starts at
    # device boundaries of 8 devices (36; 16, 32)
    Case(72, 4, 2, 8, None, 16, docs=((1, 15, 20, 1, 1, 34), (5, 11, 16, 2, 29, 9))),
    Case(64, 2, 1, 8, 9, 16, docs=((5, 11, 16, 2, 21, 9), (1, 31, 1, 31)), slow=True),
]


def case_ids(supported=lambda case: True) -> list:
    """pytest params (case, id=case.id) for the cases a path supports. Each case's tests share one xdist group
    (pyproject: --dist loadgroup), so one worker computes its inputs and oracle, once."""
    chosen = [case for case in CASES if supported(case)]
    return [pytest.param(case, id=case.id, marks=case_marks("attention-" + case.id, case.slow)) for case in chosen]


@functools.cache
def inputs(case: Case):
    """(q [B, T, Hq, d], k, v [B, T, H, d]) standard normal in the case's dtype, fresh per case."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    shapes = [(case.B, case.T, H, case.d) for H in (case.Hq, case.H, case.H)]
    return tuple(jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(case.dtype) for shape in shapes)


@functools.cache
def cotangent(case: Case):
    """A random float32 cotangent for y [B, T, Hq, d]."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()) + 1)
    return jnp.asarray(rng.standard_normal((case.B, case.T, case.Hq, case.d)), jnp.float32)


def dense_oracle(q, k, v, window):
    """Causal softmax attention of one document per row, by its definition: y_i = sum_j p_ij v_j with p_i the
    softmax of q_i . k_j / sqrt(d) over the keys j <= i with i - j < window (all j <= i for window None); query
    head h reads kv-head h // (Hq / H). Shapes as the op's, computed in the inputs' dtype (float64 here)."""
    B, T, Hq, d = q.shape
    k, v = (jnp.repeat(x, Hq // k.shape[2], axis=2) for x in (k, v))
    i, j = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    seen = (j <= i) & (i - j < (T if window is None else window))
    s = jnp.where(seen, jnp.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(d), -jnp.inf)
    w = jnp.exp(s - jax.lax.stop_gradient(s.max(-1, keepdims=True)))
    return jnp.einsum("bhij,bjhd->bihd", w / w.sum(-1, keepdims=True), v)


def reference(case: Case, q, k, v):
    """float64 `dense_oracle` on the case's inputs (any q, k, v of its shapes), each document alone when packed."""
    q, k, v = f64(q, k, v)
    if case.docs is None:
        return dense_oracle(q, k, v, case.window)
    alone = separately(case, lambda q, k, v, log_g, state0: (dense_oracle(q, k, v, case.window), None))
    return alone(q, k, v, None, None)[0]


def differentiate(case: Case, path, args, segment_ids=None):
    """Compiled (y, (dq, dk, dv)) of <y, ct> for y = path(q, k, v, segment_ids) at args = (q, k, v)."""
    ct = cotangent(case)

    def loss(q, k, v):
        y = path(q, k, v, segment_ids)
        acc = jnp.promote_types(y.dtype, jnp.float32)
        return jnp.vdot(y.astype(acc), ct.astype(acc)), y

    (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*args)
    return y, grads


@functools.cache
def oracle(case: Case):
    """float64 (y, (dq, dk, dv)) of `reference` on the case's inputs."""
    return differentiate(case, lambda q, k, v, _: reference(case, q, k, v), f64(*inputs(case)))


def check_attention_path(case: Case, path, *, tol: float | None = None):
    """Run `path` on the case (its segment ids when packed) and assert y and the gradients of <y, ct> with respect
    to q, k, v match the float64 oracle (module docstring) within the case's tolerance; returns (y, grads)."""
    tol = case.tol if tol is None else tol
    args = inputs(case)
    y, grads = differentiate(case, path, args, segment_ids(case))
    y_want, grads_want = oracle(case)
    assert y.dtype == args[2].dtype and y.shape == args[0].shape
    errors = {"y": rel_err(y, y_want)}
    dv_size = float(jnp.linalg.norm(grads_want[2]))
    for name, g, want, x in zip(("dq", "dk", "dv"), grads, grads_want, args):
        assert g.dtype == x.dtype and g.shape == x.shape, name
        if float(jnp.linalg.norm(want)) > 1e-12 * dv_size:
            errors[name] = rel_err(g, want)
        else:  # exactly zero (one visible key: the softmax is constant in q and k): rounding against dv's size
            errors[name] = float(jnp.linalg.norm(g.astype(jnp.float64) - want)) / dv_size
    bad = {name: e for name, e in errors.items() if not e < tol}  # NaN fails
    assert not bad, f"relative errors over {tol}: {bad} (all: {errors})"
    return y, grads


def cache_slots(case: Case, n: int) -> int:
    """KV-cache slots for decoding the case n tokens a step: T for full attention, else the fewest a window
    allows (window + n - 1: a ring buffer that wraps whenever that is less than T)."""
    return case.T if case.window is None else case.window + n - 1


def stepped(step, cache, n: int):
    """A path that feeds the sequence n tokens at a time to step(cache, q, k, v, segment_ids) -> (y, cache),
    starting from `cache`: a lax.scan over the whole pieces (one compiled step), then the rest of T % n tokens;
    each piece gets its own segment ids (None for one document)."""

    def path(q, k, v, segment_ids):
        T = q.shape[1]
        whole = T // n * n
        xs = (q, k, v, segment_ids)
        state, ys = cache, []
        if whole:
            pieces = [None if x is None else rearrange(x[:, :whole], "B (N n) ... -> N B n ...", n=n) for x in xs]
            state, y = jax.lax.scan(lambda c, x: step(c, *x)[::-1], state, tuple(pieces))
            ys.append(rearrange(y, "N B n ... -> B (N n) ..."))
        if whole < T:
            ys.append(step(state, *(None if x is None else x[:, whole:] for x in xs))[0])
        return jnp.concatenate(ys, axis=1)

    return path
