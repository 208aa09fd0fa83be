"""The one case table of power retention, and the checks every implementation gets on it.

A path is a function (q, k, v, log_g, state0) -> (y, final state), state0 None for a case without an initial
state. `check_path` runs it compiled, with the gradients of <y, ct_y> + <S, ct_S> + <z, ct_z> with respect to q, k,
v, log_g (when gated) and the initial state (when the case has one), and compares in float64:
- y against the quadratic reference (`power_retention_reference`; an initial state enters as the prefix it was
  made from, so the reference sees prefix + sequence);
- the final state and every gradient against the token-by-token recurrence (`power_retention_recurrence`) in
  float64, from the same initial state. That oracle is itself checked against the quadratic reference (outputs and
  gradients) on the same table, and against the direct sums at tiny sizes (test_oracles.py).
Packed cases (`docs`: each row's document lengths) run the path on the packed sequence, with segment_ids
(reset="segment_ids": path(q, k, v, log_g, state0, segment_ids)) or with log_g = -inf at each document start
(reset="log_g": the five arguments); their oracles run each document alone (`separately`: every document its own
batch row, from the initial state for a row's first document and from empty for the others), so outputs, final
states and all gradients are those of the documents run one by one. Paths run the cases they support (`case_ids`
filters by a predicate; packed cases only when asked) and say which in their files.
"""

import dataclasses
import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention import RetentionState, power_retention_reference, sympow, sympow_dim
from retention.ops.power_retention.reference import power_retention_recurrence
from tests.helpers import f64, rel_err

F32_TOL = 2e-5  # DESIGN: float32 well under 1e-4
BF16_TOL = 2e-2
PREFIX = 20  # tokens an initial state is made from


@dataclasses.dataclass(frozen=True)
class Case:
    """One configuration: gate None (no log_g), "zero" (log_g = 0, differentiated), "mild" or "strong"; chunk None
    means the op's default; init: start from a state made from PREFIX earlier tokens."""

    T: int
    Hq: int
    H: int
    d: int
    deg: int
    gate: str | None
    chunk: int | None
    dtype: str = "float32"
    init: bool = False
    B: int = 2
    docs: tuple | None = None  # packed: per row, the document lengths (summing to T)
    reset: str = "segment_ids"  # how a packed case marks its document starts: "segment_ids" or "log_g" (-inf)
    slow: bool = False  # a further case of what the quick ones check: its tests are marked slow (make test-all)

    @property
    def id(self) -> str:
        init = "-init" if self.init else ""
        packed = "" if self.docs is None else f"-{sum(map(len, self.docs))}docs-{self.reset}"
        shape = f"T{self.T}-Hq{self.Hq}-H{self.H}-d{self.d}-p{self.deg}"
        return f"{shape}-{self.gate}-c{self.chunk}-{self.dtype}{init}{packed}"

    @property
    def tol(self) -> float:
        return F32_TOL if self.dtype == "float32" else BF16_TOL


def _random_docs(T: int, seed: int) -> tuple[int, ...]:
    """Random document lengths summing to T (from 1 up, so length-1 documents come up)."""
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < T:
        lengths.append(int(min(T - sum(lengths), rng.choice([1, 2, 5, 13, 30]))))
    return tuple(lengths)


CASES = [
    Case(1, 2, 2, 32, 2, None, 16),  # one token (the Pallas decode kernel alone: 2 column blocks on GPU)
    Case(37, 4, 2, 16, 2, "mild", 16, init=True),  # GQA, odd T over 3 chunks, from a state
    Case(63, 2, 2, 6, 4, "strong", 32, slow=True),  # degree 4, strong gates, odd head dim
    Case(100, 2, 1, 16, 2, "strong", 32, init=True, slow=True),
    Case(200, 4, 1, 8, 4, "mild", 16, init=True, slow=True),  # degree 4, 4 query heads per kv-head, 13 chunks
    Case(100, 4, 2, 16, 2, "zero", 32, dtype="bfloat16"),
    Case(38, 2, 2, 8, 2, None, None, B=4, slow=True),  # gating off, the default chunk
    Case(999, 4, 1, 16, 2, "mild", 128, slow=True),  # long: 8 chunks, the last one part padding
    # packed: documents of length 1, one starting exactly on a chunk boundary (16), one spanning one (16 + 20 > 32);
    # T a multiple of 8 (context parallelism on 8 devices: a document starts exactly at device boundary 36)
    Case(72, 4, 2, 8, 2, "mild", 16, init=True, docs=((1, 15, 20, 1, 1, 34), _random_docs(72, 1))),
    # degree 4, ungated, a start at T-3
    Case(48, 2, 1, 4, 4, None, 16, docs=((7, 1, 8, 29, 3), _random_docs(48, 2)), slow=True),
    Case(40, 2, 2, 8, 2, "strong", 16, docs=((16, 1, 20, 3), _random_docs(40, 3)), reset="log_g"),
]


def case_ids(supported=lambda case: True, *, packed: bool = False, quick=lambda case: True) -> list:
    """pytest params (case, id=case.id) for the cases a path supports, the packed ones only with `packed` (the path
    then takes segment_ids, see the module docstring). Each case's tests share one xdist group (pyproject:
    --dist loadgroup), so one worker computes its inputs and oracles, once; a case with `slow`, or one `quick`
    turns down for this path, is marked slow."""
    chosen = [case for case in CASES if supported(case) and (packed or case.docs is None)]
    return [pytest.param(c, id=c.id, marks=case_marks(c.id, c.slow or not quick(c))) for c in chosen]


def case_marks(group: str, slow: bool) -> list:
    """A case's marks: its xdist group, and slow when it is a further case (make test leaves it out)."""
    return [pytest.mark.xdist_group(group)] + ([pytest.mark.slow] if slow else [])


def segment_ids(case: Case):
    """The packed case's segment ids [B, T] int32 (each document a new, non-consecutive id), or None."""
    if case.docs is None:
        return None
    ids = [np.repeat(3 * np.arange(len(lengths)) + 5, lengths) for lengths in case.docs]
    return jnp.asarray(np.stack(ids), jnp.int32)


def _layout(case: Case):
    """Each document as a batch row: (gather [R, L] into the packed tokens flattened, B*T pointing at a zero pad;
    scatter [B*T] into the rows flattened; each row's first document's row [B]; its last document's row [B])."""
    rows = [
        (b, start, n) for b, lengths in enumerate(case.docs) for start, n in zip(np.cumsum((0,) + lengths), lengths)
    ]
    L = max(n for _, _, n in rows)
    gather = np.full((len(rows), L), case.B * case.T)
    scatter = np.zeros(case.B * case.T, int)
    for r, (b, start, n) in enumerate(rows):
        gather[r, :n] = b * case.T + start + np.arange(n)
        scatter[b * case.T + start + np.arange(n)] = r * L + np.arange(n)
    first = np.array([next(r for r, row in enumerate(rows) if row[0] == b) for b in range(case.B)])
    last = np.array([max(r for r, row in enumerate(rows) if row[0] == b) for b in range(case.B)])
    return gather, scatter, first, last


def separately(case, fn):
    """A path (*tokens, state0) -> (y, state) for the packed case that runs fn(*tokens, state0) on each document
    alone (tokens: q, k, v, then per-token arrays [B, T, ...] such as log_g, each possibly None; the state any
    pytree of [B, ...] arrays): documents as batch rows, padded at their end with zero keys, values and gates
    (which change neither their rows nor their final state), the initial state entering each row's first
    document."""
    gather, scatter, first, last = _layout(case)

    def to_rows(x):
        if x is None:
            return None
        flat = x.reshape((-1,) + x.shape[2:])
        return jnp.concatenate([flat, jnp.zeros_like(flat[:1])])[gather]

    def path(*args):
        *tokens, state0 = args
        zeros = lambda x: jnp.zeros((len(gather),) + x.shape[1:], x.dtype)
        state_rows = None if state0 is None else jax.tree.map(lambda x: zeros(x).at[first].set(x), state0)
        y, state = fn(*map(to_rows, tokens), state_rows)
        q = tokens[0]
        y = y.reshape((-1,) + y.shape[2:])[scatter].reshape(q.shape[:2] + y.shape[2:])
        return y, None if state is None else jax.tree.map(lambda x: x[last], state)

    return path


def _log_gates(rng, shape, gate):
    """log_g as in tests/helpers.random_qkv: None, 0, log_sigmoid around -0.05 ("mild") or down to -20 ("strong")."""
    if gate is None:
        return None
    if gate == "zero":
        return np.zeros(shape, np.float32)
    if gate == "mild":
        return -np.log1p(np.exp(-(3.0 + rng.standard_normal(shape)))).astype(np.float32)
    return (-20.0 * rng.uniform(size=shape)).astype(np.float32)


def _state_from(prefix, deg: int) -> RetentionState:
    """The state after the prefix tokens, by its definition: S = sum_j exp(G_P - G_j) phi(k_j) v_j^T and z the
    same without v (float64 sums, stored float32)."""
    _, k, v, log_g = prefix
    k, v = np.asarray(k, np.float64), np.asarray(v, np.float64)
    G = np.cumsum(np.zeros(k.shape[:3]) if log_g is None else np.asarray(log_g, np.float64), axis=1)
    decay = np.exp(G[:, -1:] - G)  # [B, P, H]
    phi = np.asarray(jax.jit(sympow, static_argnums=1)(jnp.asarray(k), deg))  # [B, P, H, D]
    S = np.einsum("bph,bphD,bphe->bhDe", decay, phi, v)
    z = np.einsum("bph,bphD->bhD", decay, phi)
    return RetentionState(jnp.asarray(S, jnp.float32), jnp.asarray(z, jnp.float32))


@functools.cache
def inputs(case: Case):
    """((q, k, v, log_g or None, state0 or None), prefix): q, k, v standard normal in the case's dtype, log_g and the
    state float32, and the prefix (q, k, v, log_g) the state was made from (None without init). Fresh random values
    per case (numpy: nothing to compile)."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    P = PREFIX if case.init else 0
    B, T = case.B, P + case.T
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, H, case.d)), jnp.float32) for H in (case.Hq, case.H, case.H))
    q, k, v = (x.astype(case.dtype) for x in (q, k, v))
    log_g = _log_gates(rng, (B, T, case.H), case.gate)
    if case.reset == "log_g" and case.docs is not None:  # -inf at each document start (after token 0)
        starts = [np.cumsum(lengths)[:-1] + P for lengths in case.docs]
        for b, row in enumerate(starts):
            log_g[b, row] = -np.inf
    log_g = None if log_g is None else jnp.asarray(log_g)
    part = lambda x, s: None if x is None else x[:, s]
    prefix = tuple(part(x, slice(0, P)) for x in (q, k, v, log_g)) if case.init else None
    state0 = _state_from(prefix, case.deg) if case.init else None
    return (*(part(x, slice(P, T)) for x in (q, k, v, log_g)), state0), prefix


@functools.cache
def cotangents(case: Case):
    """Random float32 cotangents for y [B, T, Hq, d], S [B, H, D, d] and z [B, H, D]."""
    D = sympow_dim(case.d, case.deg)
    shapes = [(case.B, case.T, case.Hq, case.d), (case.B, case.H, D, case.d), (case.B, case.H, D)]
    rng = np.random.default_rng(zlib.crc32(case.id.encode()) + 1)
    return tuple(jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in shapes)


def _dot(x, ct):
    """<x, ct> in float32 (float64 for float64 x)."""
    acc = jnp.promote_types(x.dtype, jnp.float32)
    return jnp.vdot(x.astype(acc), ct.astype(acc))


def differentiate(case: Case, path, args, *, packed: bool = True):
    """Compiled (y, final state, gradients) of <y, ct_y> + <S, ct_S> + <z, ct_z> for `path` at args = (q, k, v,
    log_g, state0): the gradients by name, with respect to q, k, v, then log_g and (S0, z0) when given. packed:
    a packed case's path takes its segment_ids (False: an oracle that runs the documents apart)."""
    q, k, v, log_g, state0 = args
    ct_y, ct_S, ct_z = cotangents(case)
    names = ["q", "k", "v"] + (["log_g"] if log_g is not None else []) + (["S0", "z0"] if state0 is not None else [])
    given = [q, k, v] + ([log_g] if log_g is not None else []) + (list(state0) if state0 is not None else [])
    packing = (segment_ids(case),) if packed and case.docs is not None and case.reset == "segment_ids" else ()

    def loss(*xs):
        x = dict(zip(names, xs))
        s0 = RetentionState(x["S0"], x["z0"]) if state0 is not None else None
        y, state = path(x["q"], x["k"], x["v"], x.get("log_g"), s0, *packing)
        return _dot(y, ct_y) + _dot(state.S, ct_S) + _dot(state.z, ct_z), (y, state)

    grad = jax.value_and_grad(loss, argnums=tuple(range(len(given))), has_aux=True)
    (_, (y, state)), grads = jax.jit(grad)(*given)
    return y, state, dict(zip(names, grads))


_reference = jax.jit(power_retention_reference, static_argnames="deg")


def _recurrence(q, k, v, log_g, state0, *, deg):
    return power_retention_recurrence(q, k, v, log_g, state0, deg=deg)


@functools.cache
def oracle(case: Case):
    """float64: (y of the quadratic reference, and the recurrence's (y, state, gradients)); for a packed case the
    documents run one by one (`separately`; y from the recurrence when the case starts from a state)."""
    (q, k, v, log_g, state0), prefix = inputs(case)
    args64 = (*f64(q, k, v, log_g), None if state0 is None else RetentionState(*f64(*state0)))
    if case.docs is not None:
        recurrence = separately(case, functools.partial(_recurrence, deg=case.deg))
        recurrence = differentiate(case, recurrence, args64, packed=False)
        if case.init:
            return recurrence[0], recurrence
        reference = separately(case, lambda q, k, v, log_g, _: (_reference(q, k, v, log_g, deg=case.deg), None))
        return reference(*args64)[0], recurrence
    if case.init:
        full = [None if p is None else jnp.concatenate([p, x], axis=1) for p, x in zip(prefix, (q, k, v, log_g))]
        y_ref = _reference(*f64(*full), deg=case.deg)[:, PREFIX:]
    else:
        y_ref = _reference(*args64[:4], deg=case.deg)
    return y_ref, differentiate(case, functools.partial(_recurrence, deg=case.deg), args64)


def check_path(case: Case, path, *, tol: float | None = None):
    """Run `path` on the case and assert its y, final state and gradients match the oracles (module docstring);
    returns what `differentiate` does, (y, state, gradients)."""
    tol = case.tol if tol is None else tol
    args, _ = inputs(case)
    y, state, grads = differentiate(case, path, args)
    y_ref, (_, state_want, grads_want) = oracle(case)
    assert y.dtype == args[2].dtype and y.shape == args[0].shape
    assert state.S.dtype == jnp.float32 and state.z.dtype == jnp.float32
    errors = {"y": rel_err(y, y_ref), "S": rel_err(state.S, state_want.S), "z": rel_err(state.z, state_want.z)}
    dv_size = float(jnp.linalg.norm(grads_want["v"]))
    for name, g in grads.items():
        assert g.dtype == (jnp.float32 if name in ("log_g", "S0", "z0") else args[0].dtype), name
        want = grads_want[name]
        if float(jnp.linalg.norm(want)) > 1e-12 * dv_size:
            errors["d" + name] = rel_err(g, want)
        else:  # a gradient that is exactly zero (dq at T = 1: y_0 = v_0 whatever q): rounding against dv's size
            errors["d" + name] = float(jnp.linalg.norm(g.astype(jnp.float64) - want)) / dv_size
    bad = {name: e for name, e in errors.items() if not e < tol}  # NaN fails
    assert not bad, f"relative errors over {tol}: {bad} (all: {errors})"
    return y, state, grads


def pieces(T: int) -> list[tuple[int, int]]:
    """The spans a stepping path feeds: all but the last 3 tokens at once, then those 3 (all T at once for T <= 3:
    the one-token case is T = 1)."""
    return [(0, T - 3), (T - 3, T)] if T > 3 else [(0, T)]


def stepped(step, init_state_of):
    """A path that feeds `pieces(T)` in turn to step(state, q, k, v, log_g) -> (y, state), starting from state0
    (or `init_state_of(q, k)` without one). With segment_ids each piece gets its own as a keyword, and a row whose
    piece starts a document starts it from an empty state (what the PowerRetention mixer does)."""

    def path(q, k, v, log_g, state0, segment_ids=None):
        state = init_state_of(q, k) if state0 is None else state0
        ys = []
        for a, b in pieces(q.shape[1]):
            packing = {}
            if segment_ids is not None:
                packing = dict(segment_ids=segment_ids[:, a:b])
                if a > 0:  # rows whose piece starts a document start from an empty state
                    fresh = segment_ids[:, a] != segment_ids[:, a - 1]
                    fresh = fresh.reshape((-1, 1, 1, 1))
                    state = RetentionState(jnp.where(fresh, 0, state.S), jnp.where(fresh[..., 0], 0, state.z))
            y, state = step(state, q[:, a:b], k[:, a:b], v[:, a:b], None if log_g is None else log_g[:, a:b], **packing)
            ys.append(y)
        return jnp.concatenate(ys, axis=1), state

    return path
