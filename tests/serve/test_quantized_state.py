"""States quantized at rest: every value of a prefilled snapshot's S and z within its row's scale / 2 of the
float32 value (the bits' bound), scales tight (a row's largest value uses the top code), the bytes of S and z a
quarter (int8) or an eighth (4-bit) plus a scale per row, attention caches untouched, NaN kept."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention import prefill, snapshot_bytes
from retention.nn import LM, LMConfig
from retention.serve.quantized_state import dequantize_states, quantize_states

CONFIG = LMConfig(vocab_size=61, d_model=32, n_layers=2, pattern="PA", n_heads=4, n_kv_heads=2, head_dim=8)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_state_within_its_bound(bits):
    model = LM(CONFIG, rngs=nnx.Rngs(0))
    prompt = jax.random.randint(jax.random.key(1), (2, 23), 0, CONFIG.vocab_size, dtype=jnp.int32)
    snapshot = prefill(model, prompt, max_len=32)
    packed = quantize_states(snapshot, bits)
    back = dequantize_states(packed)
    qmax = 2 ** (bits - 1) - 1
    float_state, packed_state = snapshot.caches.layers[0].state, packed.caches.layers[0]
    for exact, got, scale in (
        (float_state.S, back.caches.layers[0].state.S, packed_state.state.S_scale),
        (float_state.z, back.caches.layers[0].state.z, packed_state.state.z_scale),
    ):
        exact, got, scale = (np.asarray(x, np.float64) for x in (exact, got, scale))
        assert np.all(np.abs(got - exact) <= scale / 2)
        row_max = np.max(np.abs(exact), axis=-1, keepdims=True)
        assert np.all(scale * qmax >= row_max) and np.all(scale * qmax <= row_max * (1 + 2**-7))  # bfloat16 scale
        assert np.abs(got - exact).max() > 0  # the test sees quantization
    for a, b in zip(jax.tree.leaves(snapshot.caches.layers[1]), jax.tree.leaves(back.caches.layers[1]), strict=True):
        np.testing.assert_array_equal(a, b)
    S_bytes = float_state.S.size * 4 + float_state.z.size * 4
    rows = float_state.S.size // float_state.S.shape[-1] + float_state.z.size // float_state.z.shape[-1]
    packed_bytes = (float_state.S.size + float_state.z.size) * bits // 8 + 2 * rows
    assert snapshot_bytes(snapshot) - snapshot_bytes(packed) == S_bytes - packed_bytes


def test_a_nan_row_stays_nan():
    model = LM(CONFIG, rngs=nnx.Rngs(0))
    snapshot = prefill(model, jnp.ones((1, 5), jnp.int32), max_len=8)
    state = snapshot.caches.layers[0].state
    poisoned = state._replace(S=state.S.at[0, 1, 2, 3].set(jnp.nan))
    layer = snapshot.caches.layers[0]._replace(state=poisoned)
    caches = snapshot.caches._replace(layers=(layer, *snapshot.caches.layers[1:]))
    back = dequantize_states(quantize_states(dataclasses.replace(snapshot, caches=caches)))
    S = np.asarray(back.caches.layers[0].state.S)
    assert np.all(np.isnan(S[0, 1, 2])) and np.isfinite(np.delete(S.reshape(-1, 8), 2 + 1 * S.shape[2], 0)).all()
