"""The sampler `generate` and the slot engine share: the same draws whether top_k and temperature are given once
for every row (generate: a Python int) or per row (the engine: arrays); temperature 0 takes the argmax, per row
too; every draw is among the top_k largest logits."""

import jax
import jax.numpy as jnp
import numpy as np

from retention.serve.sampling import sample

B, V = 5, 40


def logits(seed: int = 0) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (B, V), jnp.float32) * 3


def test_settings_once_or_per_row_draw_the_same_tokens():
    x, key = logits(), jax.random.key(1)
    for top_k in (None, 1, 7, V):
        once = sample(x, key, jnp.float32(0.8), top_k)
        per_row = sample(x, key, jnp.full((B,), 0.8), jnp.full((B,), V if top_k is None else top_k))
        np.testing.assert_array_equal(once, per_row)
    per_slot = jax.vmap(sample)(x, jax.random.split(key, B), jnp.full((B,), 0.8), jnp.full((B,), 7))
    assert per_slot.shape == (B,) and per_slot.dtype == jnp.int32


def test_temperature_zero_is_the_argmax_per_row():
    x, key = logits(2), jax.random.key(3)
    argmax = np.argmax(np.asarray(x), axis=-1)
    np.testing.assert_array_equal(sample(x, key, 0, None), argmax)
    np.testing.assert_array_equal(sample(x, key, 0.0, 3), argmax)
    mixed = sample(x, key, jnp.array([0.0, 1.0, 0.0, 1.0, 0.0]), jnp.full((B,), 3))
    np.testing.assert_array_equal(np.asarray(mixed)[::2], argmax[::2])


def test_draws_stay_in_the_top_k():
    x = logits(4)
    top3 = np.argsort(-np.asarray(x), axis=-1)[:, :3]
    for seed in range(20):
        drawn = np.asarray(sample(x, jax.random.key(seed), jnp.float32(5.0), 3))
        assert all(d in row for d, row in zip(drawn, top3))
    np.testing.assert_array_equal(sample(x, jax.random.key(0), jnp.float32(5.0), 1), np.argmax(np.asarray(x), -1))
