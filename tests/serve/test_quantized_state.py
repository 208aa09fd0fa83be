"""Quantized states: on random states of every fixed-state letter (P's S and z, D's and G's S; rows of very
different sizes), every dequantized value within its format's bound, derived here in float64 from the stored
scale (int8 / 4-bit: half a step, scale / 2, with the scale tight: the row's largest value uses the top code;
fp8 e4m3: 2^-4 of the value where x / s is normal, s 2^-10 below); attention caches untouched; a NaN row stays
NaN; a quantized snapshot saved and loaded is bit-identical, a flipped byte refused; the live option
re-quantizes after every decode step (greedy tokens equal a hand-written loop that does so, and differ from
the float state's); so does the slot engine's option. A quantized snapshot is refused where a model would
continue it, naming dequantize_states."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention import fork, generate, load_snapshot, prefill, save_snapshot, snapshot_bytes
from retention.nn import LM, LMConfig
from retention.serve import Engine, extend, verify
from retention.serve.quantized_state import (
    QuantizedArray,
    dequantize_states,
    quantize_states,
    round_trip_states,
)

pytestmark = pytest.mark.integration  # the serving layer (retention.serve, snapshots): make test-integration

CONFIG = LMConfig(vocab_size=61, d_model=32, n_layers=4, pattern="PDGA", n_heads=4, n_kv_heads=2, head_dim=8)
STATE_LAYERS = (0, 1, 2)  # P, D, G


def _random_states(snapshot, key):
    """The snapshot with every state array replaced by normals whose rows span 2^-8 .. 2^8 in size."""

    def fill(x, key):
        k1, k2 = jax.random.split(key)
        row_size = jnp.exp2(jax.random.uniform(k2, x.shape[:-1] + (1,), minval=-8, maxval=8))
        return jax.random.normal(k1, x.shape, jnp.float32) * row_size

    keys = iter(jax.random.split(key, 8))
    layers = list(snapshot.caches.layers)
    for i in STATE_LAYERS:
        state = layers[i].state
        if isinstance(state, jax.Array):
            layers[i] = layers[i]._replace(state=fill(state, next(keys)))
        else:
            layers[i] = layers[i]._replace(
                state=state._replace(S=fill(state.S, next(keys)), z=fill(state.z, next(keys)))
            )
    return dataclasses.replace(snapshot, caches=snapshot.caches._replace(layers=tuple(layers)))


def _state_arrays(caches, i):
    state = caches.layers[i].state
    return [state] if isinstance(state, (jax.Array, QuantizedArray)) else [state.S, state.z]


def _model_and_snapshot(key=1):
    model = LM(CONFIG, rngs=nnx.Rngs(0))
    prompt = jax.random.randint(jax.random.key(key), (2, 9), 0, CONFIG.vocab_size, dtype=jnp.int32)
    snapshot = prefill(model, prompt, max_len=16)
    return model, _random_states(snapshot, jax.random.key(key + 10))


@pytest.mark.parametrize("state_format", [pytest.param(8, marks=pytest.mark.slow), 4, "fp8"])
def test_dequantized_states_within_their_formats_bound(state_format):
    _, snapshot = _model_and_snapshot()
    packed = quantize_states(snapshot, state_format)
    back = dequantize_states(packed)
    for i in STATE_LAYERS:
        for exact, q, got in zip(*(_state_arrays(s.caches, i) for s in (snapshot, packed, back)), strict=True):
            exact, got, scale = (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (exact, got, q.scale))
            error, row_max = np.abs(got - exact), np.max(np.abs(exact), axis=-1, keepdims=True)
            if state_format == "fp8":
                assert q.values.dtype == jnp.float8_e4m3fn
                y = np.abs(exact) / scale
                bound = np.where(y >= 2.0**-6, np.abs(exact) * 2.0**-4, scale * 2.0**-10)
                np.testing.assert_allclose(scale * 448, row_max, rtol=1e-6)
            else:
                qmax = 2 ** (state_format - 1) - 1
                bound = scale / 2
                assert np.all(scale * qmax >= row_max) and np.all(scale * qmax <= row_max * (1 + 2**-7))
            assert np.all(error <= bound * (1 + 1e-6)), (i, state_format, np.max(error / bound))
            assert error.max() > 0  # the test sees quantization
    attention = (snapshot.caches.layers[3], back.caches.layers[3])
    for a, b in zip(*map(jax.tree.leaves, attention), strict=True):
        np.testing.assert_array_equal(a, b)
    assert snapshot_bytes(packed) < snapshot_bytes(snapshot)


@pytest.mark.parametrize("state_format", [8, "fp8"])
def test_a_nan_row_stays_nan(state_format):
    _, snapshot = _model_and_snapshot()
    layer = snapshot.caches.layers[1]
    poisoned = layer._replace(state=layer.state.at[0, 1, 2, 3].set(jnp.nan))
    caches = snapshot.caches._replace(layers=(snapshot.caches.layers[0], poisoned, *snapshot.caches.layers[2:]))
    back = dequantize_states(quantize_states(dataclasses.replace(snapshot, caches=caches), state_format))
    S = np.asarray(back.caches.layers[1].state)
    assert np.all(np.isnan(S[0, 1, 2])) and np.isfinite(np.delete(S.reshape(-1, 8), 2 + 1 * S.shape[2], 0)).all()


@pytest.mark.parametrize("state_format", [pytest.param(8, marks=pytest.mark.slow), "fp8"])
def test_a_quantized_snapshot_saved_and_loaded_is_bit_identical(tmp_path, state_format):
    model, snapshot = _model_and_snapshot()
    path = tmp_path / "snapshot.safetensors"
    save_snapshot(path, snapshot, state_format=state_format)
    loaded = load_snapshot(path, model)
    want = quantize_states(snapshot, state_format)
    assert jax.tree.structure(loaded) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(want), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(
            np.asarray(a).reshape(-1).view(np.uint8), np.asarray(b).reshape(-1).view(np.uint8)
        )
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x10  # a byte of the last array
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged"):
        load_snapshot(path, model)


def test_live_state_is_requantized_after_every_step():
    model = LM(dataclasses.replace(CONFIG, pattern="PD", n_layers=2), rngs=nnx.Rngs(3))
    prompt = jax.random.randint(jax.random.key(4), (4, 7), 0, CONFIG.vocab_size, dtype=jnp.int32)
    got = generate(model, prompt, 8, temperature=0.0, state_format=4).tokens[:, 7:]
    logits, caches = model.prefill(prompt, 15)
    tokens = [jnp.argmax(logits[:, -1], axis=-1)]
    requantize = jax.jit(round_trip_states, static_argnums=1)  # eagerly every primitive compiles on its own
    for _ in range(7):
        caches = requantize(caches, 4)
        logits, caches = model.decode_step(tokens[-1][:, None].astype(jnp.int32), caches)
        tokens.append(jnp.argmax(logits[:, -1], axis=-1))
    np.testing.assert_array_equal(got, jnp.stack(tokens, axis=1))
    float_tokens = generate(model, prompt, 8, temperature=0.0).tokens[:, 7:]
    assert not np.array_equal(got, float_tokens)  # 4-bit states change the greedy path: the test sees them
    engine = Engine(model, slots=2, max_len=15, state_format=4)
    ids = [engine.submit(prompt[i : i + 1], max_new_tokens=8) for i in range(2)]
    finished = engine.run()
    assert [finished[i] for i in ids] == np.asarray(got[:2]).tolist()
    with pytest.raises(ValueError, match="state_format"):
        generate(model, prompt, 2, temperature=0.0, state_format=16)


def test_a_quantized_snapshot_must_be_dequantized_to_continue():
    """generate(start=), extend, fork, verify and the engine refuse quantized states, naming dequantize_states."""
    model, snapshot = _model_and_snapshot()
    packed = quantize_states(snapshot, 8)
    message = r"(start|snapshot)'s recurrent states are quantized \(8\): call dequantize_states"
    suffix = jnp.zeros((2, 1), jnp.int32)
    with pytest.raises(ValueError, match=message):
        generate(model, suffix, 2, temperature=0.0, start=packed)
    with pytest.raises(ValueError, match=message):
        extend(model, packed, suffix)
    one = quantize_states(prefill(model, suffix[:1], max_len=16, step_tokens=2), "fp8")
    with pytest.raises(ValueError, match=message.replace("8", "'fp8'")):
        fork(one, 2)
    with pytest.raises(ValueError, match=message.replace("8", "'fp8'")):
        verify(model, one, suffix[:1].repeat(2, axis=1))
    with pytest.raises(ValueError, match=message.replace("8", "'fp8'")):
        Engine(model, slots=1, max_len=16, step_tokens=2).submit(one, max_new_tokens=2)
    generate(model, suffix, 2, temperature=0.0, start=dequantize_states(packed))  # as the message says
