"""softmax_attention(impl="splash"): splash attention in interpret mode on the softmax case table
(tests/ops/attention_cases.py: outputs and gradients against the float64 dense oracle, packed cases against each
document alone; every case, each padded to one block of 128), impl="auto" reaching splash for TPU and lowering there
(forward and backward, with segment ids), and bad segment ids raising."""

import jax
import jax.numpy as jnp
import pytest

from retention import softmax_attention
from retention.ops.platform import lowering_for
from tests.ops.attention_cases import case_ids, check_attention_path

B, Hq, H, d = 2, 4, 2, 32


def _qkv(seed, T):
    keys = jax.random.split(jax.random.key(seed), 3)
    shapes = ((B, T, Hq, d), (B, T, H, d), (B, T, H, d))
    return [jax.random.normal(key, s, jnp.float32) for key, s in zip(keys, shapes)]


@pytest.mark.parametrize("case", case_ids())
def test_splash_on_the_case_table(case):
    path = lambda q, k, v, ids: softmax_attention(q, k, v, window=case.window, segment_ids=ids, impl="splash")
    check_attention_path(case, path)


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
