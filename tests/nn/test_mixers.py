"""The mixers on their own: constructor checks, cache sizes, RoPE, and a decode step against the full forward."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from retention.nn import Attention, PowerRetention, cache_bytes
from retention.nn.layers import apply_rope

DIMS = dict(heads=4, kv_heads=2, head_dim=8)


@pytest.mark.parametrize(
    "cls, kwargs, name",
    [
        (PowerRetention, dict(heads=6, kv_heads=4), "heads"),
        (PowerRetention, dict(deg=3), "deg"),
        (PowerRetention, dict(chunk_size=100), "chunk_size"),
        (PowerRetention, dict(head_dim=7, rope_base=10000.0), "head_dim"),
        (PowerRetention, dict(impl="triton"), "impl"),
        (Attention, dict(window=0), "window"),
        (Attention, dict(kv_heads=3), "kv_heads"),
        (Attention, dict(rope_base=0.5), "rope_base"),
    ],
)
def test_constructor_validation(cls, kwargs, name):
    with pytest.raises(ValueError, match=name):
        cls(32, **{**DIMS, **kwargs}, rngs=nnx.Rngs(0))


def test_cache_sizes():
    """Retention: S and z (and each row's last segment id), the same at any max_len; full attention grows with
    max_len; a window does not."""
    P = PowerRetention(32, **DIMS, rngs=nnx.Rngs(0))
    A = Attention(32, **DIMS, rngs=nnx.Rngs(0))
    W = Attention(32, **DIMS, window=16, rngs=nnx.Rngs(0))
    size = lambda m, L, n=1: cache_bytes(jax.eval_shape(lambda: m.init_cache(3, L, jnp.float32, step_tokens=n)))
    D = 36  # C(8 + 1, 2)
    assert size(P, 10) == size(P, 10**6) == 4 * 3 * 2 * D * (8 + 1) + 4 * 3
    assert (
        size(A, 100) == 2 * 4 * 3 * 100 * 2 * 8 + 4 * 100 + 4 * 3 * 100 + 4
    )  # k, v, slot positions, segment ids, length
    assert size(W, 100) == size(W, 10**6) == size(A, 16)
    assert size(W, 100, n=4) == size(A, 16 + 3)


def test_rope_is_relative():
    """After RoPE, q_i . k_j depends only on i - j."""
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, 16), dtype=jnp.float32)
    dot = lambda i, j: jnp.sum(apply_rope(q, jnp.array([i]), 10000.0) * apply_rope(k, jnp.array([j]), 10000.0))
    assert jnp.allclose(dot(7, 3), dot(104, 100), rtol=1e-5)
    assert not jnp.allclose(dot(7, 3), dot(7, 4), rtol=1e-3)


@pytest.mark.parametrize("cls, kwargs", [(PowerRetention, dict(qk_norm=True, rope_base=500.0)), (Attention, {})])
def test_decode_steps_equal_forward(cls, kwargs):
    """Prefill 9 rows, then 2 steps of 3 and 1: the rows equal the full forward over 13 (GQA, gated retention)."""
    mixer = cls(32, **DIMS, **kwargs, rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.key(2), (2, 13, 32), dtype=jnp.float32)
    pos = jnp.arange(13, dtype=jnp.int32)
    full, none = mixer(x, positions=pos)
    assert none is None
    cache = mixer.init_cache(2, 13, jnp.float32, step_tokens=3)
    pieces = []
    for lo, hi in ((0, 9), (9, 12), (12, 13)):
        call = mixer.prefill if lo == 0 else mixer
        y, cache = call(x[:, lo:hi], positions=pos[lo:hi], cache=cache)
        pieces.append(y)
    got = jnp.concatenate(pieces, axis=1)
    assert float(jnp.linalg.norm(got - full) / jnp.linalg.norm(full)) < 1e-5
