"""Bad input raises ValueError or TypeError naming the argument and what is allowed, before any heavy work."""

import jax.numpy as jnp
import pytest

from retention import (
    init_kv_cache,
    init_state,
    power_retention,
    power_retention_step,
    softmax_attention,
    softmax_attention_step,
)

q = jnp.ones((1, 5, 4, 8), jnp.float32)
kv = jnp.ones((1, 5, 2, 8), jnp.float32)


@pytest.mark.parametrize(
    "kwargs,err,match",
    [
        (dict(q=jnp.ones((5, 4, 8), jnp.float32)), ValueError, "q must have rank 4"),
        (
            dict(k=jnp.ones((1, 5, 3, 8), jnp.float32), v=jnp.ones((1, 5, 3, 8), jnp.float32)),
            ValueError,
            "multiple of kv heads",
        ),
        (dict(v=jnp.ones((1, 5, 2, 7), jnp.float32)), ValueError, "k and v must have the same shape"),
        (dict(k=jnp.ones((1, 6, 2, 8), jnp.float32), v=jnp.ones((1, 6, 2, 8), jnp.float32)), ValueError, "must agree"),
        (dict(k=kv.astype(jnp.bfloat16)), TypeError, "share one dtype"),
        (dict(q=jnp.ones((1, 5, 4, 8), jnp.int32)), TypeError, "q must be float32"),
        (dict(deg=3), ValueError, "deg must be an even integer"),
        (dict(deg=0), ValueError, "deg must be an even integer"),
        (dict(deg=-2), ValueError, "deg must be an even integer"),
        (dict(chunk_size=48), ValueError, r"chunk_size must be one of \(None, 16"),
        (dict(chunk_size=2048), ValueError, "chunk_size"),
        (dict(log_g=jnp.zeros((1, 5, 4))), ValueError, r"log_g must have shape \[B, T, H\]"),
        (dict(scale=-1.0), ValueError, "scale must be"),
        (dict(impl="triton"), ValueError, "impl must be one of"),
        (dict(initial_state=init_state(1, 2, 8, 4)), ValueError, "initial_state must have S"),
    ],
)
def test_power_retention_bad_input(kwargs, err, match):
    args = dict(q=q, k=kv, v=kv)
    args.update(kwargs)
    with pytest.raises(err, match=match):
        power_retention(**args)


def test_pallas_names_the_degrees_it_supports():
    with pytest.raises(NotImplementedError, match="support degrees"):
        power_retention(
            jnp.ones((1, 5, 4, 16), jnp.float32),
            jnp.ones((1, 5, 2, 16), jnp.float32),
            jnp.ones((1, 5, 2, 16), jnp.float32),
            deg=4,
            impl="pallas",
        )
    with pytest.raises(ValueError, match="impl must be one of"):
        power_retention_step(init_state(1, 2, 8), q[:, :1], kv[:, :1], kv[:, :1], impl="reference")


def test_step_bad_input():
    with pytest.raises(ValueError, match="state must have S"):
        power_retention_step(init_state(1, 2, 4), q, kv, kv)
    with pytest.raises(TypeError, match="RetentionState"):
        power_retention_step((1, 2), q, kv, kv)
    with pytest.raises(ValueError, match=r"chunk_size must be one of \(None, 16"):
        power_retention_step(init_state(1, 2, 8), q, kv, kv, chunk_size=100)
    with pytest.raises(ValueError, match="impl='reference' takes no initial_state"):
        power_retention(q, kv, kv, initial_state=init_state(1, 2, 8), impl="reference")


@pytest.mark.parametrize(
    "args,match",
    [
        ((0, 2, 8), "batch must be an int >= 1, got 0"),
        ((1, 2, 8, 3), "deg must be an even integer"),
        ((1, True, 8), "heads must be an int >= 1, got True"),
    ],
)
def test_init_state_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        init_state(*args)


def test_softmax_bad_impl():
    with pytest.raises(
        ValueError, match=r"impl must be one of \('auto', 'xla', 'cudnn', 'reference', 'splash'\), got 'pallas'"
    ):
        softmax_attention(q, kv, kv, impl="pallas")


@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_softmax_bad_window(window):
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        softmax_attention(q, kv, kv, window=window)


def test_kv_cache_bad_input():
    with pytest.raises(ValueError, match="max_len must be an int >= 1"):
        init_kv_cache(1, 2, 8, 0)
    with pytest.raises(ValueError, match="max_len >= window"):
        softmax_attention_step(init_kv_cache(1, 2, 8, 4), q[:, :3], kv[:, :3], kv[:, :3], window=4)
    with pytest.raises(ValueError, match="must match on B, H, d and dtype"):
        softmax_attention_step(init_kv_cache(1, 2, 8, 16, jnp.bfloat16), q[:, :1], kv[:, :1], kv[:, :1])
