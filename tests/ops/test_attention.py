"""Softmax baselines: blockwise (forward and custom backward) against dense, windows, and KV-cache decode."""

import jax
import jax.numpy as jnp
import pytest

from retention import init_kv_cache, softmax_attention, softmax_attention_step
from retention.ops.attention.blockwise import blockwise_attention
from retention.ops.attention.reference import dense_attention
from tests.helpers import f64, random_qkv, rel_err


@pytest.mark.parametrize(
    "T,Hq,H,window,block",
    [
        (1, 2, 1, None, 16),
        (63, 4, 2, None, 16),
        (200, 4, 1, None, 64),
        (200, 2, 2, 37, 32),
        (1000, 2, 2, 100, 128),
        (300, 4, 2, 1, 64),
        (130, 2, 1, 500, 32),
    ],
)
def test_blockwise_matches_dense(T, Hq, H, window, block):
    q, k, v, _ = random_qkv(T, 2, T, Hq, H, 16)
    cot = jax.random.normal(jax.random.key(1), q.shape, jnp.float64)
    blockwise = lambda *a: blockwise_attention(*a, window=window, scale=0.25, block_size=block)
    dense = lambda *a: dense_attention(*a, window=window, scale=0.25)
    loss = lambda fn: lambda *a: jnp.sum(fn(*a).astype(jnp.float64) * cot)
    assert rel_err(blockwise(q, k, v), dense(*f64(q, k, v))) < 1e-5
    got = jax.grad(loss(blockwise), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(dense), argnums=(0, 1, 2))(*f64(q, k, v))
    for name, a, b in zip("qkv", got, want):
        if name == "v" or (T > 1 and window != 1):
            assert rel_err(a, b) < 1e-5, name
        else:  # one visible key: the softmax is constant, so dq = dk = 0 up to rounding
            assert float(jnp.abs(a).max()) < 1e-6 * float(jnp.abs(got[2]).max()), name


def test_public_op_defaults_to_blockwise_on_cpu():
    q, k, v, _ = random_qkv(3, 1, 77, 4, 2, 8)
    assert rel_err(softmax_attention(q, k, v), dense_attention(*f64(q, k, v), scale=8**-0.5)) < 1e-5
    assert rel_err(softmax_attention(q, k, v, impl="reference"), dense_attention(*f64(q, k, v), scale=8**-0.5)) < 1e-6


@pytest.mark.parametrize("window,n,max_len", [(None, 1, 90), (None, 3, 90), (9, 1, 9), (9, 4, 12), (20, 2, 21)])
def test_step_matches_full(window, n, max_len):
    """Decode n tokens at a time against a preallocated cache (a ring buffer when max_len < T)."""
    T = 85
    q, k, v, _ = random_qkv(n, 2, T, 4, 2, 8)
    full = dense_attention(*f64(q, k, v), window=window, scale=8**-0.5)
    cache = init_kv_cache(2, 2, 8, max_len)
    step = jax.jit(lambda c, *a: softmax_attention_step(c, *a, window=window), donate_argnums=0)
    for t in range(0, T - n + 1, n):
        y, cache = step(cache, q[:, t : t + n], k[:, t : t + n], v[:, t : t + n])
        assert rel_err(y, full[:, t : t + n]) < 1e-5, t
    assert int(cache.length) == (T // n) * n
