"""The mixers on their own: constructor checks, cache sizes, RoPE, and a decode step against the full forward."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from retention.nn import Attention, PowerRetention, cache_bytes
from retention.nn.layers import apply_rope
from tests.helpers import forward_and_decode_steps, rel_err

DIMS = dict(heads=4, kv_heads=2, head_dim=8)


@pytest.mark.parametrize(
    "cls, kwargs, name",
    [
        (PowerRetention, dict(heads=6, kv_heads=4), "heads"),
        (PowerRetention, dict(deg=3), "deg"),
        (PowerRetention, dict(chunk_size=100), "chunk_size"),
        (PowerRetention, dict(head_dim=7, rope_base=10000.0), "head_dim"),
        (PowerRetention, dict(impl="triton"), "impl"),
        (PowerRetention, dict(conv_size=-1), "conv_size"),
        (PowerRetention, dict(gate_bias_init=float("nan")), "gate_bias_init"),
        (Attention, dict(conv_size=1.5), "conv_size"),
        (Attention, dict(window=0), "window"),
        (Attention, dict(kv_heads=3), "kv_heads"),
        (Attention, dict(rope_base=0.5), "rope_base"),
    ],
)
def test_constructor_validation(cls, kwargs, name):
    with pytest.raises(ValueError, match=name):
        cls(32, **{**DIMS, **kwargs}, rngs=nnx.Rngs(0))


def test_cache_sizes():
    """Retention: S and z, the same at any max_len; full attention grows with max_len; a window does not. A short
    convolution adds its conv_size - 1 inputs of q, k and v to each, whatever max_len is (P's only growth)."""
    size = lambda m, L, n=1: cache_bytes(jax.eval_shape(lambda: m.init_cache(3, L, jnp.float32, step_tokens=n)))
    D = 36  # C(8 + 1, 2)
    # float32 inputs of q (4 heads), k and v (2 heads) at d 8 and their int32 segment ids, batch 3
    conv = lambda K: 4 * 3 * (K - 1) * ((4 + 2 + 2) * 8 + 1)
    for K in (0, 1, 4):
        extra = conv(K) if K else 0
        P = PowerRetention(32, **DIMS, conv_size=K, rngs=nnx.Rngs(0))
        A = Attention(32, **DIMS, conv_size=K, rngs=nnx.Rngs(0))
        W = Attention(32, **DIMS, window=16, conv_size=K, rngs=nnx.Rngs(0))
        assert size(P, 10) == size(P, 10**6) == 4 * 3 * 2 * D * (8 + 1) + 4 * 3 + extra  # S, z; each row's last id
        # k and v, slot positions, each row's slot segment ids, length
        assert size(A, 100) == 2 * 4 * 3 * 100 * 2 * 8 + 4 * 100 + 4 * 3 * 100 + 4 + extra
        assert size(W, 100) == size(W, 10**6) == size(A, 16)
        assert size(W, 100, n=4) == size(A, 16 + 3)


def test_rope_is_relative():
    """After RoPE, q_i . k_j depends only on i - j."""
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, 16), dtype=jnp.float32)
    dot = lambda i, j: jnp.sum(apply_rope(q, jnp.array([i]), 10000.0) * apply_rope(k, jnp.array([j]), 10000.0))
    assert jnp.allclose(dot(7, 3), dot(104, 100), rtol=1e-5)
    assert not jnp.allclose(dot(7, 3), dot(7, 4), rtol=1e-3)


DECODE_CASES = [  # (mixer, options, whether steps of 3 tokens are in the quick tier too)
    (PowerRetention, dict(qk_norm=True, rope_base=500.0), False),
    (PowerRetention, dict(conv_size=4, qk_norm=True, gate_bias_init=1.0), True),
    (PowerRetention, dict(conv_size=4, gating=False), False),
    (Attention, {}, False),
    (Attention, dict(conv_size=4, qk_norm=True), False),
    (Attention, dict(conv_size=4, window=5), True),
]


@pytest.mark.parametrize(
    "cls, kwargs, n",
    [
        pytest.param(cls, kwargs, n, id=f"{cls.__name__}{i}-n{n}", marks=[pytest.mark.slow] * (n == 3 and not quick))
        for i, (cls, kwargs, quick) in enumerate(DECODE_CASES)
        for n in (1, 3)
    ],
)
def test_decode_steps_equal_forward(cls, kwargs, n):
    """Prefill 8 rows, then steps of n tokens: the rows equal the full forward over 14 (GQA, gated retention; a
    window of 5 wraps its ring buffer; the conv cache carries the last 3 inputs across every step)."""
    mixer = cls(32, **DIMS, **kwargs, rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.key(2), (2, 14, 32), dtype=jnp.float32)
    full, got = forward_and_decode_steps(mixer, x, n)
    assert rel_err(got, full) < 1e-5


def test_options_reach_the_parameters():
    """gate_bias_init is the gate's initial bias; gating=False drops the gate; conv_size gives one [K, channels]
    kernel per q, k, v; qk_norm one scale per q and k (both for attention too)."""
    P = PowerRetention(32, **DIMS, conv_size=3, qk_norm=True, gate_bias_init=-1.5, rngs=nnx.Rngs(0))
    assert jnp.all(P.gate_proj.bias[...] == -1.5)
    assert [c.kernel.shape for c in (P.conv.q, P.conv.k, P.conv.v)] == [(3, 32), (3, 16), (3, 16)]
    assert PowerRetention(32, **DIMS, gating=False, rngs=nnx.Rngs(0)).gate_proj is None
    A = Attention(32, **DIMS, conv_size=2, qk_norm=True, rngs=nnx.Rngs(0))
    assert A.conv.k.kernel.shape == (2, 16) and A.qk_norm.q_norm.scale.shape == (8,)
    assert Attention(32, **DIMS, rngs=nnx.Rngs(0)).conv is None
