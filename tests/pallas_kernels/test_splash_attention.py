"""softmax_attention(impl="splash"): splash attention in interpret mode against the float64 dense reference (causal,
a sliding window, grouped-query heads, an odd length that splash's blocks pad, packed documents against each document
alone, gradients), impl="auto" reaching splash for TPU and lowering there (forward and backward, with segment ids),
and bad segment ids raising."""

import jax
import jax.numpy as jnp
import pytest

from retention import softmax_attention
from retention.ops.attention.reference import dense_attention
from retention.ops.platform import lowering_for
from tests.helpers import f64, rel_err

TOL = 2e-5
B, T, Hq, H, d = 2, 200, 4, 2, 32  # T pads to 256 (two blocks of 128)


def _qkv(seed, T=T):
    keys = jax.random.split(jax.random.key(seed), 3)
    shapes = ((B, T, Hq, d), (B, T, H, d), (B, T, H, d))
    return [jax.random.normal(key, s, jnp.float32) for key, s in zip(keys, shapes)]


@pytest.mark.parametrize("window", [None, 37])
def test_splash_equals_dense_reference(window):
    q, k, v = _qkv(0)
    y = jax.jit(lambda *a: softmax_attention(*a, window=window, impl="splash"))(q, k, v)
    assert rel_err(y, dense_attention(*f64(q, k, v), window=window, scale=d**-0.5)) < TOL


def test_splash_gradients_equal_dense_reference():
    q, k, v = _qkv(1)
    ct = jax.random.normal(jax.random.key(2), q.shape)
    grads = lambda op, *a: jax.grad(lambda q, k, v: jnp.sum(op(q, k, v) * ct), argnums=(0, 1, 2))(*a)
    got = jax.jit(lambda *a: grads(lambda *x: softmax_attention(*x, impl="splash"), *a))(q, k, v)
    want = grads(lambda *x: dense_attention(*x, window=None, scale=d**-0.5), *f64(q, k, v))
    for name, a, b in zip("qkv", got, want):
        assert rel_err(a, b) < TOL, "d" + name


def test_splash_packed_documents_equal_each_document_alone():
    q, k, v = _qkv(3)
    starts = [0, 70, 128, 150]  # a boundary inside a block, one on a block edge
    ids = jnp.concatenate(
        [jnp.full((B, e - s), 5 * i + 1) for i, (s, e) in enumerate(zip(starts, starts[1:] + [T]))], 1
    )
    y = jax.jit(lambda *a: softmax_attention(*a, impl="splash", segment_ids=ids))(q, k, v)
    for s, e in zip(starts, starts[1:] + [T]):
        alone = dense_attention(*f64(q[:, s:e], k[:, s:e], v[:, s:e]), window=None, scale=d**-0.5)
        assert rel_err(y[:, s:e], alone) < TOL, (s, e)


def test_auto_takes_splash_for_tpu_and_lowers():
    """Under `lowering_for("tpu")` impl="auto" is splash (a Mosaic call in the module), forward and backward."""
    x = jax.ShapeDtypeStruct((B, 256, Hq, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((B, 256, H, 64), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((B, 256), jnp.int32)
    fwd = lambda q, k, v, ids: softmax_attention(q, k, v, segment_ids=ids)
    bwd = jax.grad(lambda *a: fwd(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))
    with jax.enable_x64(False), lowering_for("tpu"):  # x64: see retention/ops/attention/splash.py
        for name, f in (("forward", fwd), ("backward", bwd)):
            module = jax.export.export(jax.jit(f), platforms=["tpu"])(x, kv, kv, ids).mlir_module()
            assert "tpu_custom_call" in module, name


def test_bad_segment_ids_raise():
    q, k, v = _qkv(4, T=16)
    with pytest.raises(ValueError, match=r"segment_ids must have shape \[B, T\] = \(2, 16\), got \(2, 15\)"):
        softmax_attention(q, k, v, impl="splash", segment_ids=jnp.zeros((B, 15), jnp.int32))
    with pytest.raises(TypeError, match=r"segment_ids must be an integer array \[B, T\] \(int32\), got float32"):
        softmax_attention(q, k, v, impl="splash", segment_ids=jnp.zeros((B, 16), jnp.float32))
