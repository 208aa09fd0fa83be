"""The quantized KV cache (retention/ops/attention/quantized.py): quantization error within what the bits allow, the
decode step on the softmax case table (tests/ops/attention_cases.py) against dense attention over the dequantized
keys and values and against the float cache (within a bound derived from the group maxima), its bytes, and the
attention mixer and LM decoding with it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention.nn import LM, LMConfig, cache_bytes
from retention.ops.attention import (
    KVCache,
    fill_quantized_kv_cache,
    init_kv_cache,
    init_quantized_kv_cache,
    softmax_attention_step,
    softmax_attention_step_quantized,
)
from retention.ops.attention.quantized import default_group, dequantize, quantize
from tests.helpers import random_qkv, rel_err
from tests.ops.attention_cases import CASES, cache_slots, case_ids, inputs, reference, stepped

BF16_STEP = 2.0**-7  # bfloat16's relative spacing: a scale rounded up to bfloat16 grows by at most this


def error_bound(x, bits, group):
    """Per value: half the quantization step the group's max allows, max|x| / (2^(bits-1) - 1) / 2, plus the
    rounding of the scale up to bfloat16."""
    x_g = np.asarray(x, np.float64).reshape(*x.shape[:-1], -1, group)
    step = np.abs(x_g).max(-1, keepdims=True) / (2 ** (bits - 1) - 1) * (1 + BF16_STEP)
    return np.broadcast_to(step / 2, x_g.shape).reshape(x.shape)


@pytest.mark.parametrize("bits,group", [(8, 16), (4, 16), (4, 32), (8, 8)])
def test_quantize_errs_at_most_half_a_step_per_value(bits, group):
    x = 3.0 * jax.random.normal(jax.random.key(bits + group), (3, 5, 64)) * jnp.linspace(0.01, 2, 64)
    q, scale = quantize(x, bits, group)
    assert q.shape == (3, 5, 64 * bits // 8) and q.dtype == (jnp.int8 if bits == 8 else jnp.uint8)
    assert scale.shape == (3, 5, 64 // group) and scale.dtype == jnp.bfloat16
    err = np.abs(np.asarray(dequantize(q, scale), np.float64) - np.asarray(x, np.float64))
    bound = error_bound(x, bits, group)
    assert np.all(err <= bound * (1 + 1e-6)), float((err / bound).max())
    assert (err / bound).max() > 0.5  # the bound is the real step, not a loose one


def test_quantize_keeps_zero_groups_and_marks_non_finite_groups():
    x = jax.random.normal(jax.random.key(0), (2, 32)).at[0, :16].set(0.0).at[1, 3].set(jnp.nan)
    for bits in (8, 4):
        y = np.asarray(dequantize(*quantize(x, bits)))
        assert np.all(y[0, :16] == 0) and np.all(np.isfinite(y[0, 16:]))
        assert np.all(np.isnan(y[1, :16])) and np.all(np.isfinite(y[1, 16:]))  # the NaN's group, not zeros


def test_4bit_values_are_packed_two_per_byte():
    """The nibbles hold q + 8: the byte of (q0, q1) is (q0 + 8) | (q1 + 8) << 4."""
    x = jnp.array([[7.0, -7.0, 1.0, 0.0] + [0.0] * 12])
    q, scale = quantize(x, 4)
    assert float(scale[0, 0]) == 1.0
    assert q[0, :2].tolist() == [15 | (1 << 4), 9 | (8 << 4)]


@pytest.mark.parametrize("case", case_ids(lambda case: case.docs is None))
def test_step_equals_dense_attention_over_the_dequantized_cache(case):
    """The case table (tests/ops/attention_cases.py; the quantized cache holds one document per row), 8 bits fed a
    token a step on every other case, 4 bits 5 tokens a step on the rest (a ring buffer for a window, as the float
    step's test): y equals the float64 dense oracle over the keys and values as the cache stores them. Outputs
    only: rounding has no useful gradient."""
    bits, n = (8, 1) if CASES.index(case) % 2 == 0 else (4, 5)
    group = default_group(case.d)
    step = lambda cache, q, k, v, _: softmax_attention_step_quantized(cache, q, k, v, window=case.window)
    path = stepped(step, init_quantized_kv_cache(case.B, case.H, case.d, cache_slots(case, n), bits, group), n)
    q, k, v = inputs(case)
    y = jax.jit(lambda q, k, v: path(q, k, v, None))(q, k, v)
    k_hat, v_hat = (dequantize(*quantize(x, bits, group), dtype=x.dtype) for x in (k, v))
    assert y.dtype == v.dtype and rel_err(y, reference(case, q, k_hat, v_hat)) < case.tol


def attention_error_bound(q, k, v, bits, scale):
    """Bound on |y_quantized - y_float| per output value of the last query row over all keys, from the value bounds:
    each score moves by at most e = scale * sum_c |q_c| dk_c, so each probability by a factor in [exp(-2E),
    exp(2E)] (E the largest e), and |dy| <= (exp(2E) - 1) max_j |v_j| + max_j dv_j."""
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))  # [B, T, H, d], one query head per kv head
    dk, dv = error_bound(k, bits, 16), error_bound(v, bits, 16)
    E = (scale * np.einsum("bhd,bjhd->bhj", np.abs(q64[:, -1]), dk)).max(-1)  # [B, H]
    spread = np.abs(v64).max(1)  # [B, H, d]
    return (np.exp(2 * E) - 1)[..., None] * spread + dv.max(1)


@pytest.mark.parametrize("bits", [pytest.param(8, marks=pytest.mark.slow), 4])
def test_step_against_the_float_cache_within_the_bits_bound(bits):
    """A prefilled quantized cache then one decode step against the same with a float cache: every output value
    within the bound the bits allow, and the error is real (not zero)."""
    T, d = 200, 32
    q, k, v, _ = random_qkv(7 + bits, 3, T, 2, 2, d)
    v = v * jnp.linspace(0.1, 3, d, dtype=v.dtype)  # groups of different ranges
    prompt = lambda x: x[:, : T - 1]
    float_cache = KVCache(
        k=jnp.zeros((3, 2, T, d), k.dtype).at[:, :, : T - 1].set(prompt(k).swapaxes(1, 2)),
        v=jnp.zeros((3, 2, T, d), v.dtype).at[:, :, : T - 1].set(prompt(v).swapaxes(1, 2)),
        pos=jnp.where(jnp.arange(T) < T - 1, jnp.arange(T), -1).astype(jnp.int32),
        segment_ids=jnp.zeros((3, T), jnp.int32),
        length=jnp.asarray(T - 1, jnp.int32),
    )
    quantized = fill_quantized_kv_cache(init_quantized_kv_cache(3, 2, d, T, bits), prompt(k), prompt(v))
    last = lambda x: x[:, T - 1 :]
    y_float, _ = softmax_attention_step(float_cache, last(q), last(k), last(v))
    y_quant, cache = softmax_attention_step_quantized(quantized, last(q), last(k), last(v))
    err = np.abs(np.asarray(y_quant[:, 0], np.float64) - np.asarray(y_float[:, 0], np.float64))
    bound = attention_error_bound(q, k, v, bits, d**-0.5)
    assert np.all(err <= bound * (1 + 1e-4) + 1e-6), float((err / bound).max())
    assert err.max() > 1e-3 * bound.max()
    assert int(cache.length) == T and cache.pos.tolist() == list(range(T))


@pytest.mark.parametrize("bits,group,bits_per_value", [(8, 16, 9), (4, 16, 5), (4, 32, 4.5)])
def test_cache_bytes_are_the_packed_bytes(bits, group, bits_per_value):
    """Keys and values cost bits + 16 / group bits each (the bfloat16 scale), plus the slots' positions."""
    B, H, L, d = 2, 3, 40, 64
    cache = init_quantized_kv_cache(B, H, d, L, bits, group)
    assert cache_bytes(cache) == 2 * B * H * L * d * bits_per_value / 8 + 4 * L + 4
    float_bytes = cache_bytes(init_kv_cache(B, H, d, L, jnp.bfloat16))
    assert cache_bytes(cache) < float_bytes * bits_per_value / 16 + 4 * L + 4 + 1


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(bits=3), "bits must be one of"),
        (dict(group=5), "group must divide head_dim=32"),
        (dict(group=0), "group must be an int"),
    ],
)
def test_bad_quantization_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        init_quantized_kv_cache(1, 1, 32, 8, **{"bits": 8, **kwargs})


def test_4bit_needs_an_even_head_dim():
    with pytest.raises(ValueError, match="head_dim must be even"):
        init_quantized_kv_cache(1, 1, 3, 8, 4, group=1)


def test_step_refuses_a_cache_of_other_shapes():
    q, k, v, _ = random_qkv(0, 1, 1, 2, 2, 16)
    with pytest.raises(ValueError, match="must match on B, H and d"):
        softmax_attention_step_quantized(init_quantized_kv_cache(1, 1, 16, 8, 8), q, k, v)


@pytest.mark.parametrize("bits", [8, 4])
def test_lm_decodes_with_a_quantized_cache(bits):
    """An LM with kv_cache_bits: its caches are quantized (and smaller), prefill then decode runs, and the logits
    stay close to the float cache's (they differ: the cache is lossy)."""
    config = LMConfig(
        vocab_size=50, d_model=32, n_layers=2, pattern="AW", n_heads=2, n_kv_heads=1, head_dim=16, window=6
    )
    tokens = jax.random.randint(jax.random.key(1), (2, 20), 0, 50, dtype=jnp.int32)
    logits = {}
    for cache_bits in (None, bits):
        model = LM(dataclasses.replace(config, kv_cache_bits=cache_bits), rngs=nnx.Rngs(0))
        out, caches = model.prefill(tokens[:, :12], 20, step_tokens=4)
        steps = [out]
        for t in range(12, 20, 4):
            out, caches = model.decode_step(tokens[:, t : t + 4], caches)
            steps.append(out)
        logits[cache_bits] = jnp.concatenate(steps, axis=1)
        assert int(caches.length) == 20
    float_model = LM(config, rngs=nnx.Rngs(0))
    assert rel_err(logits[None], float_model(tokens)) < 2e-5
    assert rel_err(logits[bits][:, :12], logits[None][:, :12]) < 2e-5  # the prompt runs in float
    err = rel_err(logits[bits], logits[None])
    assert 0 < err < (2e-2 if bits == 8 else 2e-1), err
    quantized_model = LM(dataclasses.replace(config, kv_cache_bits=bits), rngs=nnx.Rngs(0))
    nbytes = lambda m: cache_bytes(jax.eval_shape(lambda: m.init_caches(1, 4096)))
    assert nbytes(quantized_model) < nbytes(float_model) * (bits + 1) / 32 + 2 * 4096 * 4 + 64


def test_lm_refuses_other_cache_bits():
    with pytest.raises(ValueError, match="kv_cache_bits must be one of"):
        LMConfig(kv_cache_bits=2)


_float_step = jax.jit(softmax_attention_step)  # compiled: eagerly each primitive of each step compiles on its own
_quantized_step = jax.jit(softmax_attention_step_quantized)


@pytest.mark.parametrize("bits", [8, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("where", ["k", pytest.param("v", marks=pytest.mark.slow)])
def test_a_non_finite_key_or_value_poisons_the_rows_as_the_float_cache_does(bits, where):
    """An inf in one channel of a key or value, in the prompt (filled) or in a decode step: every later row of its
    batch row and kv-head is NaN in all its channels, exactly where the float cache's step gives NaN (not only in
    the inf's group of 16), and every other row is finite."""
    T, d, P = 12, 32, 5
    q, k, v, _ = random_qkv(bits, 2, T, 4, 2, d)
    for t_bad in (2, 8):  # in the prompt, in a decode step
        arrays = {"k": k, "v": v}
        arrays[where] = arrays[where].at[0, t_bad, 1, 21].set(jnp.inf)
        kb, vb = arrays["k"], arrays["v"]
        prompt = lambda x: x[:, :P]
        float_cache = init_kv_cache(2, 2, d, T)
        _, float_cache = _float_step(float_cache, prompt(q), prompt(kb), prompt(vb))
        quantized = fill_quantized_kv_cache(init_quantized_kv_cache(2, 2, d, T, bits), prompt(kb), prompt(vb))
        for t in range(P, T):
            step = lambda x, t=t: x[:, t : t + 1]
            y_float, float_cache = _float_step(float_cache, step(q), step(kb), step(vb))
            y_quant, quantized = _quantized_step(quantized, step(q), step(kb), step(vb))
            expected_nan = np.zeros(y_float.shape, bool)
            expected_nan[0, :, 2:4] = t >= t_bad  # query heads 2 and 3 read kv-head 1
            np.testing.assert_array_equal(np.isnan(y_float), expected_nan)
            np.testing.assert_array_equal(np.isnan(y_quant), expected_nan, err_msg=f"t_bad={t_bad}, t={t}")
            assert np.isfinite(np.asarray(y_quant)[~expected_nan]).all()
