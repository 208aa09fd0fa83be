"""phi(x) . phi(y) == (x . y)^p, exactly (float64), for the layouts the op uses."""

from math import comb

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention.ops.power_retention.sympow import sympow, sympow_dim, sympow_weights


@pytest.mark.parametrize(
    "d,p", [(1, 2), (5, 2), pytest.param(64, 2, marks=pytest.mark.slow), (7, 4), (3, 4), (4, 6), (9, 6)]
)
def test_inner_product_is_power(d, p):
    x, y = jax.random.normal(jax.random.key(d * 10 + p), (2, 11, d), jnp.float64)
    phi_x, phi_y = sympow(x, p), sympow(y, p)
    assert phi_x.shape == (11, comb(d + p - 1, p)) == (11, sympow_dim(d, p))
    # the feature sum cancels down to (x.y)^p: rounding is relative to (|x| |y|)^p, not to the result
    size = (jnp.linalg.norm(x, axis=-1) * jnp.linalg.norm(y, axis=-1)) ** p
    np.testing.assert_allclose(jnp.sum(phi_x * phi_y, -1) / size, jnp.sum(x * y, -1) ** p / size, rtol=0, atol=1e-13)


@pytest.mark.parametrize("d,p", [(6, 2), (5, 4)])
def test_transposed_layout_is_the_same_map(d, p):
    x = jax.random.normal(jax.random.key(1), (3, d, 13), jnp.float64)  # [..., d, c]
    np.testing.assert_array_equal(sympow(x, p, axis=-2), jnp.swapaxes(sympow(jnp.swapaxes(x, -1, -2), p), -1, -2))


def test_weights_are_sqrt_multinomials():
    w = sympow_weights(3, 2)  # (0,0) (0,1) (0,2) (1,1) (1,2) (2,2)
    np.testing.assert_allclose(w**2, [1, 2, 2, 1, 2, 1])


@pytest.mark.parametrize("p", [0, 1, 3, -2])
def test_bad_degree(p):
    with pytest.raises(ValueError, match="deg"):
        sympow(jnp.ones((2, 3)), p)
