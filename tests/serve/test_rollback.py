"""Rollback without a re-run: the caches `LM.rollback` selects from one verify step equal (float32 rounding) the
caches after exactly the kept tokens (run one decode step each), for every layer letter of the registry (with the short
convolution's taps, and a quantized sliding-window ring buffer whose overwritten slots must come back), at
j = 0, 1 and k accepted drafts (kept = j + 1 tokens) and at kept = 0 (bit-exact); the verify step's logits are the
decode steps'. The per-token states of one power-retention chunk equal the chunk step run on each prefix, and the
matrix-state scan equals the linear-attention step op on each prefix."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention.nn import LM, LMConfig
from retention.nn.matrix_state import step_states
from retention.nn.registry import MIXERS
from retention.ops import RetentionState, init_state, linear_attention_step
from retention.ops.power_retention.recurrent import chunk_states, chunk_step

K = 3  # drafts: a verify step feeds K + 1 tokens
QUICK = {"P", "A", "M"}  # the other letters' rollbacks, and W's float cache, are further cases (8-bit W is quick)
CASES = [pytest.param(c, None, marks=[pytest.mark.slow] * (c not in QUICK)) for c in MIXERS] + [("W", 8)]


def _config(letter: str, kv_cache_bits) -> LMConfig:
    options = dict(vocab_size=37, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, conv_size=3)
    return LMConfig(pattern=letter, window=3, kv_cache_bits=kv_cache_bits, **options)


def _largest_difference_in_ulps(a, b) -> float:
    """The largest |a - b| over the leaves, each in float32 ulps (2^-23) of that leaf's largest magnitude in b (at
    least 1): a verify step's per-token states and the decode steps sum the same terms in other orders, so they
    agree to a few ulps of the state's scale (this check's states reach about 10, where 2e-6 is under 2 ulps)."""
    ulp = float(jnp.finfo(jnp.float32).eps)
    largest = lambda x: float(jnp.max(jnp.abs(x.astype(jnp.float32))))
    ulps = jax.tree.map(lambda x, y: largest(x - y) / (ulp * max(largest(y), 1.0)), a, b)
    return max(jax.tree.leaves(ulps))


@pytest.mark.parametrize(("letter", "kv_cache_bits"), CASES)
def test_rolled_back_caches_equal_a_step_of_the_kept_tokens(letter, kv_cache_bits):
    model = LM(_config(letter, kv_cache_bits), rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 11), 0, 37, dtype=jnp.int32)
    _, before = model.prefill(tokens[:, :7], 16, step_tokens=K + 1)  # a window of 3: the ring buffer wraps
    fed = tokens[:, 7:]
    logits, trails = model.verify_step(fed, before)
    assert _largest_difference_in_ulps(model.rollback(before, trails, 0), before) == 0.0
    caches = before
    for kept in range(1, K + 2):  # the oracle: the kept tokens run one decode step each
        step_logits, caches = model.decode_step(fed[:, kept - 1 : kept], caches)
        np.testing.assert_allclose(logits[:, kept - 1], step_logits[:, 0], rtol=1e-5, atol=1e-5)
        if kept in (1, 2, K + 1):  # j = 0, 1, K drafts accepted
            got = model.rollback(before, trails, kept)
            assert jax.tree.structure(got) == jax.tree.structure(caches)
            assert _largest_difference_in_ulps(got, caches) <= 4, (letter, kept)
            assert int(got.length) == 7 + kept and got.position.tolist() == [7 + kept] * 2


def _random_state_and_tokens(n: int, deg: int):
    keys = jax.random.split(jax.random.key(4), 6)
    B, H, d = 2, 3, 6
    q, k, v = (jax.random.normal(keys[i], (B, n, H, d), jnp.float32) for i in range(3))
    log_g = jax.nn.log_sigmoid(jax.random.normal(keys[3], (B, n, H), jnp.float32) + 1.0)
    empty = init_state(B, H, d, deg)
    state = RetentionState(
        jax.random.normal(keys[4], empty.S.shape, jnp.float32), jax.random.uniform(keys[5], empty.z.shape)
    )
    return state, q, k, v, log_g


@pytest.mark.parametrize("segment_ids", [None, [[0, 0, 1, 1, 1], [0, 2, 2, 2, 3]]])
def test_per_token_states_of_one_chunk_equal_the_chunk_step_on_each_prefix(segment_ids):
    state, q, k, v, log_g = _random_state_and_tokens(5, deg=2)
    ids = None if segment_ids is None else jnp.array(segment_ids, jnp.int32)
    got = jax.jit(partial(chunk_states, deg=2))(state, k, v, log_g, segment_ids=ids)
    assert got.S.shape == (5,) + state.S.shape
    step = jax.jit(partial(chunk_step, deg=2, scale=1.0))
    for i in range(5):
        prefix = lambda x, i=i: None if x is None else x[:, : i + 1]
        _, want = step(state, *map(prefix, (q, k, v, log_g)), segment_ids=prefix(ids))
        np.testing.assert_allclose(got.S[i], want.S, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got.z[i], want.z, rtol=1e-5, atol=1e-5)


def test_matrix_state_scan_equals_the_step_op_on_each_prefix():
    _, q, k, v, log_g = _random_state_and_tokens(5, deg=2)
    state = jax.random.normal(jax.random.key(5), (2, 3, 6, 6), jnp.float32)
    ids = jnp.array([[0, 0, 1, 1, 1], [0, 2, 2, 2, 3]], jnp.int32)
    got = jax.jit(partial(step_states, linear_attention_step))(state, (q, k, v, log_g), ids)
    step = jax.jit(linear_attention_step)
    for i in range(5):
        _, want = step(
            state, q[:, : i + 1], k[:, : i + 1], v[:, : i + 1], log_g[:, : i + 1], segment_ids=ids[:, : i + 1]
        )
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)
