"""A decode step of n tokens after t0 cached ones (a chunked prefill from a cache) folds the old cache's keys in
blocks only up to its last filled slot: its rows equal the float64 dense oracle's rows t0..t0+n-1 of the whole
sequence on odd shapes (pieces not a multiple of the key block, an empty cache, a cache nearly full, a partly
filled and a wrapped ring buffer), and it never reads the slots after the last filled block (NaN there changes
nothing; the step before issue 44 scored every slot of max_len and gave NaN). The key blocks are made 16 keys
(STEP_SCORE_BYTES patched down) so these small shapes span several."""

import jax
import jax.numpy as jnp
import pytest

from retention.ops.attention import decode, fill_kv_cache, init_kv_cache, softmax_attention_step
from tests.helpers import f64, random_qkv, rel_err
from tests.ops.attention_cases import dense_oracle
from tests.ops.cases import F32_TOL

B, HQ, H, D = 2, 4, 2, 8


@pytest.fixture(autouse=True)
def sixteen_key_blocks(monkeypatch):
    monkeypatch.setattr(decode, "STEP_SCORE_BYTES", 1)  # `_key_block`'s least: 16 keys a block


def cached_then_step(q, k, v, t0: int, slots: int, window):
    """The rows t0.. of a step of the tokens t0.. after a cache of `slots` slots filled with the first t0 (a ring
    buffer for a window: fed in steps of n, as a ring of window + n - 1 slots is filled)."""
    n = q.shape[1] - t0
    cache = init_kv_cache(B, H, D, slots)
    if window is None or t0 <= slots:
        cache = fill_kv_cache(cache, k[:, :t0], v[:, :t0])
    else:
        for lo in range(0, t0, n):
            hi = min(lo + n, t0)
            _, cache = softmax_attention_step(cache, q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], window=window)
    step = jax.jit(lambda c, q, k, v: softmax_attention_step(c, q, k, v, window=window))  # traced with 16-key blocks
    return step(cache, q[:, t0:], k[:, t0:], v[:, t0:])


@pytest.mark.parametrize(
    "t0, n, slots, window",
    [
        (37, 11, 100, None),  # 3 filled blocks of 16 (the last partly), 11 new tokens
        (85, 13, 100, None),  # nearly full: 98 of 100 slots after the step, the last block overlapping
        (0, 7, 40, None),  # an empty cache: no old block folded
        (32, 16, 48, None),  # filled to a block edge, full after the step
        (10, 5, 24, 20),  # a ring buffer (window 20, steps of 5) partly filled
        (61, 5, 24, 20),  # a ring buffer wrapped: every slot filled
    ],
)
def test_a_step_after_a_cache_equals_the_float64_oracle(t0, n, slots, window):
    q, k, v, _ = random_qkv(t0 * 131 + n, B, t0 + n, HQ, H, D)
    y, cache = cached_then_step(q, k, v, t0, slots, window)
    want = dense_oracle(*f64(q, k, v), window)[:, t0:]
    assert y.shape == (B, n, HQ, D) and int(cache.length) == t0 + n
    assert rel_err(y, want) < F32_TOL


def test_a_step_never_reads_the_slots_after_the_last_filled_block():
    t0, n, slots = 37, 11, 100  # the filled blocks hold slots 0..47
    q, k, v, _ = random_qkv(5, B, t0 + n, HQ, H, D)
    cache = fill_kv_cache(init_kv_cache(B, H, D, slots), k[:, :t0], v[:, :t0])
    poisoned = cache._replace(k=cache.k.at[:, :, 48:].set(jnp.nan), v=cache.v.at[:, :, 48:].set(jnp.nan))
    step = jax.jit(lambda c: softmax_attention_step(c, q[:, t0:], k[:, t0:], v[:, t0:])[0])
    assert jnp.array_equal(step(poisoned), step(cache))
