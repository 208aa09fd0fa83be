"""Properties the three matrix-state ops share, beyond agreement with their oracles: a non-finite input poisons
exactly the rows that see it (its row and the later rows of its document, on every path: chunked, token
recurrence, decode token by token), and bad arguments raise naming the argument before any work."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention import init_matrix_state
from tests.ops.matrix_state_ops import OPS

B, T, Hq, H, D = 2, 40, 4, 2, 8
DOC_END = 30  # a second document starts here: the poison of the first never reaches it
IDS = jnp.asarray(np.repeat([[0] * DOC_END + [1] * (T - DOC_END)], B, axis=0), jnp.int32)


def _inputs(op, seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((B, T, Hq, D)), rng.standard_normal((B, T, H, D)), rng.standard_normal((B, T, H, D))
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    log_g = rng.uniform(-0.5, 0, (B, T, H, D) if op.gate == "channel" else (B, T, H))
    tokens = dict(q=q, k=k, v=v) | (dict(beta=rng.uniform(0, 1, (B, T, H))) if op.beta else {}) | dict(log_g=log_g)
    return {name: jnp.asarray(x, jnp.float32) for name, x in tokens.items()}


ORDER = ("q", "k", "v", "beta", "log_g")  # the ops' positional order (a dict under jit comes back sorted by key)


def _args(x: dict) -> list:
    return [x[name] for name in ORDER if name in x]


def _paths(op):
    """name -> f(tokens dict) -> o, each compiled once."""
    full = jax.jit(lambda x: op.full(*_args(x), segment_ids=IDS, chunk_size=16))
    recurrence = jax.jit(lambda x: op.recurrence(*_args(x), None, segment_ids=IDS)[0])
    step = jax.jit(op.step)

    def decode(x):
        state, outputs = init_matrix_state(B, H, D, D), []
        for t in range(T):
            if t == DOC_END:
                state = jnp.zeros_like(state)  # the new document starts from an empty state
            o, state = step(state, *(a[:, t : t + 1] for a in _args(x)))
            outputs.append(o)
        return jnp.concatenate(outputs, axis=1)

    return dict(chunked=full, recurrence=recurrence, decode=decode)


PATHS = {(name, path): None for name in OPS for path in ("chunked", "recurrence", "decode")}
POISONS = [("k", 5, np.nan), ("v", 21, np.inf), ("q", 17, np.nan), ("log_g", 12, np.nan), ("beta", 8, np.nan)]
_compiled = {}


@pytest.mark.parametrize("op_name,path", PATHS)
@pytest.mark.parametrize("name,t,value", POISONS)
def test_a_poisoned_token_poisons_what_sees_it_and_nothing_else(op_name, path, name, t, value):
    """The value at token t of kv-head 0 (query head 0 for q): NaN in exactly that query row, or in the rows t..29
    of the query heads of kv-head 0 (the first document's end); every other entry exactly as without it."""
    op = OPS[op_name]
    if name == "beta" and not op.beta:
        pytest.skip("no beta")
    fn = _compiled.setdefault((op_name, path), _paths(op)[path])
    x = _inputs(op, t)
    clean = np.asarray(fn(x))
    x[name] = x[name].at[:, t, 0].set(value)
    got = np.asarray(fn(x))
    nan = np.zeros(got.shape, bool)
    if name == "q":
        nan[:, t, 0] = True
    else:
        nan[:, t:DOC_END, :2] = True
    assert np.isfinite(clean).all()
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan], clean[~nan])


def _call(op, *, step=False, state=None, **changes):
    """The op (or its step) on small valid inputs with `changes` replacing some of them."""
    rng = np.random.default_rng(0)
    x = dict(
        q=rng.standard_normal((2, 5, 4, 8)), k=rng.standard_normal((2, 5, 2, 8)), v=rng.standard_normal((2, 5, 2, 6))
    )
    if op.beta:
        x["beta"] = rng.uniform(0, 1, (2, 5, 2))
    x["log_g"] = -rng.uniform(0, 1, (2, 5, 2, 8) if op.gate == "channel" else (2, 5, 2))
    x = {n: jnp.asarray(a, jnp.float32) for n, a in x.items()}
    keywords = {n: changes.pop(n) for n in list(changes) if n not in x}
    x.update(changes)
    if step:
        return op.step(init_matrix_state(2, 2, 8, 6) if state is None else state, *_args(x), **keywords)
    return op.full(*_args(x), **keywords)


BAD = [
    (dict(q=jnp.zeros((2, 5, 8), jnp.float32)), ValueError, "q must have rank 4"),
    (dict(k=jnp.zeros((2, 5, 2, 8), jnp.int32)), TypeError, "k must be float32"),
    (dict(v=jnp.zeros((3, 5, 2, 6), jnp.float32)), ValueError, "must agree on B, T, H"),
    (dict(q=jnp.zeros((2, 5, 3, 8), jnp.float32)), ValueError, "multiple of kv heads"),
    (dict(log_g=jnp.full((2, 5, 2, 8), 0.5, jnp.float32)), ValueError, "log_g must"),
    (dict(log_g=jnp.zeros((2, 5), jnp.float32)), ValueError, "log_g must have shape"),
    (dict(chunk_size=20), ValueError, "chunk_size must be one of"),
    (dict(scale=-1.0), ValueError, "scale must be"),
    (dict(segment_ids=jnp.zeros((2, 4), jnp.int32)), ValueError, "segment_ids must have shape"),
    (dict(initial_state=jnp.zeros((2, 2, 8, 8), jnp.float32)), ValueError, "initial_state must have shape"),
    (dict(initial_state=jnp.zeros((2, 2, 8, 6), jnp.float64)), TypeError, "initial_state must be float32"),
    (dict(beta=jnp.full((2, 5, 2), 1.5, jnp.float32)), ValueError, "beta must be in"),
    (dict(beta=jnp.zeros((2, 5, 2, 1), jnp.float32)), ValueError, "beta must have shape"),
]


@pytest.mark.parametrize("op_name", OPS)
@pytest.mark.parametrize("changes,error,message", BAD, ids=[m for _, _, m in BAD])
def test_bad_arguments_raise_naming_the_argument(op_name, changes, error, message):
    op = OPS[op_name]
    if "beta" in changes and not op.beta:
        pytest.skip("no beta")
    if message == "log_g must" and op.gate == "scalar":
        changes = dict(log_g=jnp.full((2, 5, 2), 0.5, jnp.float32))
    with pytest.raises(error, match=message):
        _call(op, **changes)


@pytest.mark.parametrize("op_name", OPS)
def test_bad_step_state_raises_naming_it(op_name):
    with pytest.raises(ValueError, match="state must have shape"):
        _call(OPS[op_name], step=True, state=jnp.zeros((2, 2, 6, 8), jnp.float32))
    with pytest.raises(ValueError, match="log_g must"):
        _call(
            OPS[op_name], step=True, log_g=jnp.full((2, 5, 2, 8) if OPS[op_name].gate == "channel" else (2, 5, 2), 1.0)
        )


def test_gla_needs_its_gates():
    with pytest.raises(ValueError, match="log_g must be an array"):
        _call(OPS["gated_linear_attention"], log_g=None)
