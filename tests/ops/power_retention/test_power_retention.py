"""Properties of the power-retention op beyond agreement with the oracles (test_power_retention_paths.py beside
it): the chunk size does not change the result, a million tokens stay finite and bounded, causality is exact, and the
backward's grouped rematerialisation changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention import power_retention
from retention.ops.power_retention import chunked
from tests.helpers import random_qkv, rel_err

F32_TOL = 2e-5  # DESIGN: float32 well under 1e-4


def _loss(fn, cotangent):
    return lambda q, k, v, log_g: jnp.sum(fn(q, k, v, log_g).astype(jnp.float64) * cotangent)


@pytest.mark.parametrize("chunk", [16, 32, 64])
def test_chunk_size_does_not_change_the_result(chunk):
    q, k, v, log_g = random_qkv(3, 1, 150, 2, 2, 8, gate="mild")
    ys = [jax.jit(lambda *a, c=c: power_retention(*a, chunk_size=c))(q, k, v, log_g) for c in (chunk, 128)]
    assert rel_err(ys[0], ys[1]) < F32_TOL


@pytest.mark.parametrize("gate", [None, "mild"])
def test_million_tokens_stay_finite_and_bounded(gate):
    """2^20 tokens: the weights are non-negative, so each output is a convex mix of values, inside [min v, max v]."""
    T = 1 << 20
    q, k, v, log_g = random_qkv(9, 1, T, 1, 1, 4, gate=gate)
    y = np.asarray(jax.jit(lambda *a: power_retention(*a, chunk_size=64))(q, k, v, log_g))
    v = np.asarray(v)
    assert np.isfinite(y).all()
    running_min = np.minimum.accumulate(v[0, :, 0], axis=0)
    running_max = np.maximum.accumulate(v[0, :, 0], axis=0)
    slack = 1e-4 * np.abs(v).max()
    assert (y[0, :, 0] >= running_min - slack).all() and (y[0, :, 0] <= running_max + slack).all()


@jax.jit
def _causal_grads(q, k, v, log_g, cot):
    """Gradients of <power_retention(q, k, v, log_g), cot> (chunk 16), compiled once for every row t below."""
    loss = lambda *a: jnp.sum(power_retention(*a, chunk_size=16).astype(jnp.float64) * cot)
    return jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, log_g)


@pytest.mark.parametrize("t", [0, 15, 16, 40, 70])
def test_causality(t):
    """Gradient of y_t (random cotangent at row t only) with respect to every input after t is exactly zero."""
    T = 71
    q, k, v, log_g = random_qkv(t, 1, T, 4, 2, 8, gate="mild")
    cot = jnp.zeros(q.shape, jnp.float64).at[:, t].set(jax.random.normal(jax.random.key(t), q[:, t].shape))
    grads = _causal_grads(q, k, v, log_g, cot)
    for name, g in zip("q k v log_g".split(), grads):
        assert jnp.all(g[:, t + 1 :] == 0), name
        if t > 0 or name != "log_g":  # y_0 = v_0 whatever the gate
            assert jnp.any(g[:, : t + 1] != 0), name


def test_grouped_state_remat_gives_the_same_values_and_gradients(monkeypatch):
    """Past its state budget the backward keeps only group-boundary states (N = 13 chunks: groups of 4, padded)."""
    q, k, v, log_g = random_qkv(8, 1, 200, 4, 2, 8, gate="mild")
    cot = jax.random.normal(jax.random.key(3), q.shape, jnp.float64)
    loss = _loss(lambda *a: power_retention(*a, chunk_size=16), cot)
    want = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, log_g)
    monkeypatch.setattr(chunked, "STATE_BUDGET_BYTES", 0)  # read when the second one is traced
    assert chunked._state_group(13, 1) == 4
    got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, log_g)
    assert abs(float(got[0]) - float(want[0])) <= 1e-5 * abs(float(want[0]))
    for name, a, b in zip("q k v log_g".split(), got[1], want[1]):
        assert rel_err(a, b) < 1e-5, name
