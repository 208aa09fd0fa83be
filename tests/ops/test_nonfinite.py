"""No silent garbage: a NaN or inf in an input gives NaN in its row and in the later rows that see it (its document),
never zeros, and leaves every earlier row exactly as without it; a positive or NaN gate gives NaN; -inf (or a gate
that is 0 in float32) is an exact reset. Every path: power retention's reference, XLA chunked, step (a prompt, and
decode token by token), token recurrence; softmax's dense, blockwise and KV-cache step. (Context parallelism:
tests/parallel/multidevice_context_parallel.py; the Pallas kernels: the kernels' tests.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention import (
    init_kv_cache,
    init_state,
    power_retention,
    power_retention_step,
    softmax_attention,
    softmax_attention_step,
)
from retention.ops.power_retention.reference import power_retention_recurrence
from tests.helpers import random_qkv, rel_err

T, CHUNK = 40, 16


def _decode(step, init, q, k, v, log_g=None):
    """Token by token through a compiled step (compiled once: module-level): y [B, T, Hq, d]."""
    state, ys = init, []
    for t in range(q.shape[1]):
        y, state = step(
            state, q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], None if log_g is None else log_g[:, t : t + 1]
        )
        ys.append(y)
    return jnp.concatenate(ys, axis=1)


_retention_step = jax.jit(lambda state, *x: power_retention_step(state, *x))
_softmax_step = jax.jit(lambda cache, q, k, v, _: softmax_attention_step(cache, q, k, v))
RETENTION_PATHS = {
    "reference": jax.jit(lambda q, k, v, g: power_retention(q, k, v, g, impl="reference")),
    "xla": jax.jit(lambda q, k, v, g: power_retention(q, k, v, g, chunk_size=CHUNK, impl="xla")),
    "step": jax.jit(lambda q, k, v, g: power_retention_step(init_state(2, 2, 8), q, k, v, g, chunk_size=16)[0]),
    "recurrence": jax.jit(lambda q, k, v, g: power_retention_recurrence(q, k, v, g)[0]),
    "decode": lambda q, k, v, g: _decode(_retention_step, init_state(2, 2, 8), q, k, v, g),
}
SOFTMAX_PATHS = {
    "dense": lambda q, k, v, g: softmax_attention(q, k, v, impl="reference"),
    "blockwise": jax.jit(lambda q, k, v, g: softmax_attention(q, k, v)),
    "window": jax.jit(lambda q, k, v, g: softmax_attention(q, k, v, window=9)),
    "decode": lambda q, k, v, g: _decode(_softmax_step, init_kv_cache(2, 2, 8, T), q, k, v),
}
PATHS = {f"retention-{n}": f for n, f in RETENTION_PATHS.items()} | {
    f"softmax-{n}": f for n, f in SOFTMAX_PATHS.items()
}


def _poison(name, t, value, q, k, v, g):
    """The inputs with `value` in `name` at token t (every head of it for q, k, v; kv-head 0 for log_g)."""
    x = dict(q=q, k=k, v=v, log_g=g)
    x[name] = x[name].at[:, t, 0].set(value)
    return x["q"], x["k"], x["v"], x["log_g"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "name,t,value", [("k", 5, jnp.nan), ("v", 21, jnp.inf), ("q", 17, jnp.nan), ("log_g", 30, jnp.nan)]
)
def test_a_poisoned_token_poisons_what_sees_it_and_nothing_before(path, name, t, value):
    """NaN in k at token 5 (no row may become 0), inf in v, NaN in a query row (only that row), a NaN gate
    (retention only: later rows of kv-head 0's query heads)."""
    if name == "log_g" and path.startswith("softmax"):
        pytest.skip("softmax has no gates")
    q, k, v, g = random_qkv(t, 2, T, 4, 2, 8, gate="mild")
    clean = np.asarray(PATHS[path](q, k, v, g))
    got = np.asarray(PATHS[path](*_poison(name, t, value, q, k, v, g)))
    nan = np.zeros(got.shape, bool)  # where NaN belongs: every other entry is exactly as without the poison
    if name == "q":
        nan[:, t, 0] = True
    else:  # query heads 0 and 1 read kv-head 0, from the poisoned token on (within the window)
        nan[:, t : t + 9 if path == "softmax-window" else T, :2] = True
    assert np.isnan(got[nan]).all() and np.array_equal(got[~nan], clean[~nan])


@pytest.mark.parametrize("path", [p for p in PATHS if p != "retention-decode" and p != "softmax-decode"])
def test_a_poisoned_document_leaves_the_next_one_alone(path):
    """A NaN key in the first of two packed documents: NaN in that document from it on, the second document exact."""
    q, k, v, g = random_qkv(1, 2, T, 4, 2, 8, gate="mild")
    seg = jnp.asarray(np.repeat([0, 1], [23, T - 23])[None].repeat(2, 0), jnp.int32)
    run = {
        "retention-reference": lambda *a: power_retention(*a, segment_ids=seg, impl="reference"),
        "retention-xla": lambda *a: power_retention(*a, segment_ids=seg, chunk_size=CHUNK, impl="xla"),
        "retention-step": lambda *a: power_retention_step(init_state(2, 2, 8), *a, segment_ids=seg)[0],
        "retention-recurrence": lambda *a: power_retention_recurrence(*a, segment_ids=seg)[0],
        "softmax-dense": lambda q, k, v, g: softmax_attention(q, k, v, segment_ids=seg, impl="reference"),
        "softmax-blockwise": lambda q, k, v, g: softmax_attention(q, k, v, segment_ids=seg),
        "softmax-window": lambda q, k, v, g: softmax_attention(q, k, v, window=30, segment_ids=seg),
    }[path]
    run = jax.jit(run)  # one program for both calls (eagerly every primitive compiles on its own)
    clean, got = (np.asarray(run(*x)) for x in ((q, k, v, g), _poison("k", 10, jnp.nan, q, k, v, g)))
    assert np.array_equal(got[:, :10], clean[:, :10]) and np.isnan(got[:, 10:23, :2]).all()
    assert rel_err(got[:, 23:], clean[:, 23:]) < 1e-6  # same values (another program may round differently)


@pytest.mark.parametrize("path", RETENTION_PATHS)
@pytest.mark.parametrize("gate", [3.0, jnp.inf])
def test_a_positive_gate_gives_nan(path, gate):
    """Traced (under jit) a positive gate cannot raise: it gives NaN from its token on (was finite: +3, or 0: +inf)."""
    q, k, v, g = random_qkv(2, 2, T, 4, 2, 8, gate="mild")
    run = RETENTION_PATHS[path] if path == "decode" else jax.jit(RETENTION_PATHS[path])  # decode: a jitted step
    got = np.asarray(run(*_poison("log_g", 12, gate, q, k, v, g)))
    assert np.isnan(got[:, 12:, :2]).all() and np.isfinite(got[:, :12]).all() and np.isfinite(got[:, :, 2:]).all()


def test_a_positive_gate_with_known_values_raises():
    q, k, v, g = random_qkv(2, 1, 8, 2, 2, 8, gate="mild")
    message = r"log_g must be <= 0 \(a log-gate; -inf is a reset\), got 3.0 at index \(0, 5, 1\)"
    with pytest.raises(ValueError, match=message):
        power_retention(q, k, v, g.at[0, 5, 1].set(3.0))


@pytest.mark.parametrize("path", RETENTION_PATHS)
@pytest.mark.parametrize("gate", [-jnp.inf, -1e9])
def test_a_zero_gate_is_an_exact_reset(path, gate):
    """log_g = -inf at token 23 (neither 0 on the xla path nor NaN in the reference) or -1e9 (20% off): the rows from 23
    equal the second part run alone, in float32 rounding, and the first part is untouched."""
    q, k, v, g = random_qkv(3, 2, T, 4, 2, 8, gate="mild")
    got = np.asarray(RETENTION_PATHS[path](q, k, v, g.at[:, 23].set(gate)))
    alone = RETENTION_PATHS["reference"]
    assert rel_err(got[:, 23:], alone(q[:, 23:], k[:, 23:], v[:, 23:], g[:, 23:])) < 2e-6
    assert rel_err(got[:, :23], alone(q[:, :23], k[:, :23], v[:, :23], g[:, :23])) < 2e-6


_SEG = jnp.asarray(np.repeat([4, 9], [17, T - 17])[None].repeat(2, 0), jnp.int32)  # a document starts at 17
PACKED_RETENTION_PATHS = {
    "reference": lambda *a: power_retention(*a, segment_ids=_SEG, impl="reference"),
    "xla": lambda *a: power_retention(*a, segment_ids=_SEG, chunk_size=CHUNK, impl="xla"),
    "pallas": lambda *a: power_retention(*a, segment_ids=_SEG, chunk_size=CHUNK, impl="pallas"),
    "step": lambda *a: power_retention_step(init_state(2, 2, 16), *a, segment_ids=_SEG, chunk_size=16)[0],
    "recurrence": lambda *a: power_retention_recurrence(*a, segment_ids=_SEG)[0],
}


@pytest.mark.parametrize("path", PACKED_RETENTION_PATHS)
@pytest.mark.parametrize("t", [0, 17])
@pytest.mark.parametrize("gate", [jnp.nan, 3.0])
def test_a_bad_gate_at_a_document_start_poisons_that_document(path, t, gate):
    """A NaN or positive gate at a document's first token (token 0, and token 17 where the id changes) is no valid
    gate whatever the reset there: NaN in that document's rows of kv-head 0 from it on (was finite at 17), the
    rows before it exactly as without it, every other row the same."""
    q, k, v, g = random_qkv(4, 2, T, 4, 2, 16, gate="mild")  # d 16: the Pallas kernels'
    run = jax.jit(PACKED_RETENTION_PATHS[path])
    clean = np.asarray(run(q, k, v, g))
    got = np.asarray(run(*_poison("log_g", t, gate, q, k, v, g)))
    nan = np.zeros(got.shape, bool)
    nan[:, t : 17 if t == 0 else T, :2] = True
    assert np.isnan(got[nan]).all() and np.array_equal(got[:, :t], clean[:, :t])
    # the other rows: the same values (the poisoned gate leaves the gates' cumulative sum, so it rounds otherwise)
    assert np.isfinite(got[~nan]).all() and rel_err(got[~nan], clean[~nan]) < 1e-6


UNDERFLOW_PATHS = {
    "reference": lambda q, k, v, g, s: power_retention(q, k, v, g, scale=s, impl="reference"),
    "xla": lambda q, k, v, g, s: power_retention(q, k, v, g, scale=s, chunk_size=CHUNK, impl="xla"),
    "pallas": lambda q, k, v, g, s: power_retention(q, k, v, g, scale=s, chunk_size=CHUNK, impl="pallas"),
    "step": lambda q, k, v, g, s: power_retention_step(init_state(2, 2, 16), q, k, v, g, scale=s, chunk_size=16)[0],
    "recurrence": lambda q, k, v, g, s: power_retention_recurrence(q, k, v, g, scale=s)[0],
}


@pytest.mark.parametrize("path", UNDERFLOW_PATHS)
def test_weights_that_all_underflow_give_nan_never_zeros(path):
    """A row whose weights (scale q.k)^p exp(G_i - G_j) all round to 0 in float32 has a normaliser of 0: NaN, not
    the zeros it gave (nor the reference's mean of the values). scale=1e-30 does that to every row; a query 1e-25
    times smaller at token 0 (it sees only its own key) to row 0 alone, every other row exactly as without it."""
    q, k, v, g = random_qkv(8, 2, T, 4, 2, 16, gate="mild")  # d 16: the Pallas kernels'
    run = jax.jit(UNDERFLOW_PATHS[path], static_argnums=4)
    assert np.isnan(np.asarray(run(q, k, v, g, 1e-30))).all()
    clean = np.asarray(run(q, k, v, g, None))
    got = np.asarray(run(q.at[:, 0].multiply(1e-25), k, v, g, None))
    assert np.isnan(got[:, 0]).all() and np.array_equal(got[:, 1:], clean[:, 1:]) and np.isfinite(clean).all()


@pytest.mark.parametrize("scale", [0.0, -1e-30, float("nan"), float("inf"), True])
def test_a_scale_that_is_not_positive_and_finite_is_refused(scale):
    q, k, v, g = random_qkv(8, 1, 4, 2, 2, 8, gate="mild")
    with pytest.raises(ValueError, match=r"scale must be a finite number in \(0.0, inf\), got"):
        power_retention(q, k, v, g, scale=scale)
    with pytest.raises(ValueError, match=r"scale must be a finite number in \(0.0, inf\), got"):
        softmax_attention(q, k, v, scale=scale)
