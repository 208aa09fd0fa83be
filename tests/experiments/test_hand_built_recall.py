"""The hand-built power-retention layer (experiments/hand_built_recall.py): its float64 outputs are the project's
power_retention op (the quadratic reference) summed over heads; its keys are the previous token's embedding only
where that token is a key id; a key repeated in the filler writes a competing value with the true pair's weight."""

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.hand_built_recall import embeddings, layer_qkv, recall_accuracy, retention_outputs
from retention import power_retention

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration


@pytest.mark.parametrize("deg", [2, 4])
def test_outputs_are_power_retention_summed_over_heads(deg):
    rng = np.random.default_rng(7)
    B, T, H, d = 2, 13, 3, 8
    q, k = rng.standard_normal((B, H, T, d)), rng.standard_normal((B, H, T, d))
    v = rng.standard_normal((B, T, d))
    ours = retention_outputs(q, k, v, deg)
    as_op = lambda x: jnp.asarray(np.moveaxis(x, 1, 2), jnp.float32)  # [B, T, H, d]
    v_BTHd = jnp.asarray(np.repeat(v[:, :, None], H, axis=2), jnp.float32)
    y = power_retention(as_op(q), as_op(k), v_BTHd, deg=deg, impl="reference")
    np.testing.assert_allclose(np.asarray(y).sum(2), ours, rtol=2e-4, atol=2e-5)


def test_keys_values_and_a_repeated_key():
    """Row: key 3, value 70, filler 9, key 3 again, value 99, filler, query 3. Position s holds the key of token
    s - 1 (zero after a value or filler id >= 64 and at s = 0) and the value onehot(x_s); at the query both 70
    and 99 get weight 1 (the exact match), so neither wins over the other."""
    V = 128
    e = embeddings(V, 1, 16, np.random.default_rng(0))
    inputs = np.array([[3, 70, 100, 3, 99, 120, 3]])
    q, k, v = layer_qkv(inputs, e, n_keys=63)
    assert np.all(k[0, 0, [0, 2, 3, 5, 6]] == 0)  # after 70, 100, 99, 120 and at s = 0: no key written
    np.testing.assert_allclose(k[0, 0, 1], e[0, 3])
    np.testing.assert_allclose(k[0, 0, 4], e[0, 3])
    np.testing.assert_allclose(q[0, 0, 6], e[0, 3])
    assert np.all(v[0].argmax(-1) == inputs[0])
    y = retention_outputs(q, k, v, deg=2)[0, 6]
    assert y[70] == pytest.approx(0.5) and y[99] == pytest.approx(0.5) and y.sum() == pytest.approx(1.0)


def test_unknown_filler_is_refused():
    with pytest.raises(ValueError, match="filler must be one of .*'values'.*, got 'noise'"):
        recall_accuracy(head_dim=8, deg=2, gap=0, filler="noise")
