"""Gradients of the chunked op: against the reference's (float64), the reference against finite differences,
and causality (the gradient of y_t with respect to anything after t is exactly zero)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention import power_retention, power_retention_reference
from tests.helpers import f64, random_qkv, rel_err


def _loss(fn, cotangent):
    return lambda q, k, v, log_g: jnp.sum(fn(q, k, v, log_g).astype(jnp.float64) * cotangent)


@pytest.mark.parametrize(
    "T,Hq,H,d,deg,gate,chunk",
    [(63, 4, 1, 8, 2, "mild", 16), (200, 2, 2, 8, 2, "strong", 32), (150, 4, 2, 4, 4, "mild", 64), (37, 2, 2, 8, 2, None, 16)],
)
def test_gradients_match_reference(T, Hq, H, d, deg, gate, chunk):
    q, k, v, log_g = random_qkv(T, 2, T, Hq, H, d, gate=gate or "mild")
    if gate is None:
        log_g = jnp.zeros_like(log_g)  # gating off, but still differentiate with respect to the gate
    cot = jax.random.normal(jax.random.key(99), q.shape, jnp.float64)
    chunked = lambda *a: power_retention(*a, deg=deg, chunk_size=chunk)
    reference = lambda *a: power_retention_reference(*a, deg=deg)
    got = jax.grad(_loss(chunked, cot), argnums=(0, 1, 2, 3))(q, k, v, log_g)
    want = jax.grad(_loss(reference, cot), argnums=(0, 1, 2, 3))(*f64(q, k, v, log_g))
    for name, a, b in zip("q k v log_g".split(), got, want):
        assert a.dtype == jnp.float32, name
        assert rel_err(a, b) < 1e-4, name


def test_reference_gradient_matches_finite_differences():
    q, k, v, log_g = f64(*random_qkv(4, 1, 6, 2, 1, 3, gate="mild"))
    cot = jax.random.normal(jax.random.key(5), q.shape, jnp.float64)
    loss = _loss(lambda *a: power_retention_reference(*a, deg=2), cot)
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, log_g)
    args = [q, k, v, log_g]
    eps = 1e-6
    for i, g in enumerate(grads):
        direction = jax.random.normal(jax.random.key(10 + i), args[i].shape, jnp.float64)
        plus = args.copy(); plus[i] = args[i] + eps * direction
        minus = args.copy(); minus[i] = args[i] - eps * direction
        numeric = (loss(*plus) - loss(*minus)) / (2 * eps)
        np.testing.assert_allclose(jnp.sum(g * direction), numeric, rtol=1e-6)


@pytest.mark.parametrize("t", [0, 15, 16, 40, 70])
def test_causality(t):
    """Gradient of y_t (random cotangent at row t only) with respect to every input after t is exactly zero."""
    T = 71
    q, k, v, log_g = random_qkv(t, 1, T, 4, 2, 8, gate="mild")
    cot = jnp.zeros(q.shape, jnp.float64).at[:, t].set(jax.random.normal(jax.random.key(t), q[:, t].shape))
    loss = _loss(lambda *a: power_retention(*a, chunk_size=16), cot)
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, log_g)
    for name, g in zip("q k v log_g".split(), grads):
        assert jnp.all(g[:, t + 1 :] == 0), name
        if t > 0 or name != "log_g":  # y_0 = v_0 whatever the gate
            assert jnp.any(g[:, : t + 1] != 0), name


def test_grouped_state_remat_gives_the_same_values_and_gradients(monkeypatch):
    """Past its state budget the backward keeps only group-boundary states (N = 13 chunks: groups of 4, padded)."""
    from retention.ops.power_retention import chunked

    q, k, v, log_g = random_qkv(8, 1, 200, 4, 2, 8, gate="mild")
    cot = jax.random.normal(jax.random.key(3), q.shape, jnp.float64)
    loss = _loss(lambda *a: power_retention(*a, chunk_size=16), cot)
    want = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(q, k, v, log_g)
    monkeypatch.setattr(chunked, "STATE_BUDGET_BYTES", 0)
    assert chunked._state_group(13, 1) == 4
    got = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(q, k, v, log_g)
    assert abs(float(got[0]) - float(want[0])) <= 1e-5 * abs(float(want[0]))
    for name, a, b in zip("q k v log_g".split(), got[1], want[1]):
        assert rel_err(a, b) < 1e-5, name
