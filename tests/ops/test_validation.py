"""Bad input raises ValueError or TypeError naming the argument and what is allowed, before any heavy work."""

import jax
import jax.numpy as jnp
import pytest

from retention import (
    RetentionState,
    init_kv_cache,
    init_state,
    power_retention,
    power_retention_step,
    softmax_attention,
    softmax_attention_step,
)
from retention.ops.attention import init_quantized_kv_cache, softmax_attention_step_quantized

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


@pytest.mark.parametrize("shape", [(0, 5, 4, 8), (1, 5, 0, 8), (1, 5, 4, 0), (1, 0, 4, 8)])
@pytest.mark.parametrize("op", ["power_retention", "softmax_attention"])
def test_zero_sizes_are_refused(shape, op):
    """B, H or d of 0 gave ZeroDivisionError."""
    B, T, H, d = shape
    x, kv_ = jnp.ones(shape, jnp.float32), jnp.ones((B, T, H // 2, d), jnp.float32)
    with pytest.raises(ValueError, match=r"q must have every size \(B, T, heads, d\) >= 1, got shape"):
        {"power_retention": power_retention, "softmax_attention": softmax_attention}[op](x, kv_, kv_)


def test_a_float_chunk_size_is_refused():
    """chunk_size=16.0 gave "`pad_width` must be of integral type"."""
    with pytest.raises(ValueError, match=r"chunk_size must be None or an int, one of \(16, .*\), got 16.0"):
        power_retention(q, kv, kv, chunk_size=16.0)


def test_a_state_of_the_wrong_dtype_or_degree_is_refused():
    """A bfloat16 initial_state gave a scan-carry TypeError; a degree-4 state for deg=2 is named."""
    s = init_state(1, 2, 8)
    bf16 = RetentionState(s.S.astype(jnp.bfloat16), s.z.astype(jnp.bfloat16))
    with pytest.raises(TypeError, match="initial_state must hold float32 S and z .* got S bfloat16"):
        power_retention(q, kv, kv, initial_state=bf16, return_state=True)
    with pytest.raises(TypeError, match="state must hold float32 S and z"):
        power_retention_step(bf16, q[:, :1], kv[:, :1], kv[:, :1])
    with pytest.raises(ValueError, match=r"state must have S \[B, H, D, d\] = \(1, 2, 36, 8\) .* for deg=2, got S"):
        power_retention_step(init_state(1, 2, 8, 4), q[:, :1], kv[:, :1], kv[:, :1])


@pytest.mark.parametrize(
    "args,err,match",
    [
        ((1, 0, 8, 16), ValueError, "heads must be an int >= 1, got 0"),
        ((1, 2, 8, 16, jnp.int32), TypeError, "dtype must be float32, bfloat16, float16 or float64"),
        ((1, 2, 8, 2.5), ValueError, "max_len must be an int >= 1, got 2.5"),
    ],
)
def test_init_kv_cache_bad_input(args, err, match):
    with pytest.raises(err, match=match):
        init_kv_cache(*args)


def test_a_full_attention_step_past_max_len_is_refused_at_trace_time():
    """200 tokens into 16 slots were silently wrong (rows after 16 off by up to 1.4); one token past a full cache
    too (the cache's length is known while tracing the Python loop's calls)."""
    need = r"a full-attention cache needs max_len >= its length \+ n = {} \+ {}, got max_len=16"
    with pytest.raises(ValueError, match=need.format(0, 200)):
        softmax_attention_step(init_kv_cache(1, 2, 8, 16), *(jnp.ones((1, 200, h, 8), jnp.float32) for h in (4, 2, 2)))
    cache = init_kv_cache(1, 2, 8, 16)
    one = [jnp.ones((1, 1, h, 8), jnp.float32) for h in (4, 2, 2)]
    for _ in range(16):
        _, cache = softmax_attention_step(cache, *one)
    with pytest.raises(ValueError, match=need.format(16, 1)):
        softmax_attention_step(cache, *one)


@pytest.mark.parametrize(
    "segment_ids,err,match",
    [
        (jnp.zeros((1, 4), jnp.int32), ValueError, r"segment_ids must have shape \[B, T\] = \(1, 5\), got \(1, 4\)"),
        (jnp.zeros((1, 5)), TypeError, "segment_ids must be an integer array"),
        (jnp.asarray([[0, 1, 0, 0, 0]], jnp.int32), ValueError, "segment_ids must keep each document contiguous"),
    ],
)
@pytest.mark.parametrize("op", ["power_retention", "softmax_attention"])
def test_bad_segment_ids(segment_ids, err, match, op):
    with pytest.raises(err, match=match):
        {"power_retention": power_retention, "softmax_attention": softmax_attention}[op](
            q, kv, kv, segment_ids=segment_ids
        )


def _full_cache():
    """A full-attention cache with all 16 slots used."""
    cache = init_kv_cache(1, 2, 8, 16)
    return softmax_attention_step(cache, *(jnp.ones((1, 16, h, 8), jnp.float32) for h in (4, 2, 2)))[1]


nan_at = lambda x, t: x.at[0, t].set(jnp.nan)
DEBUG_CASES = {
    "q": (lambda q: power_retention(q, kv, kv, debug_checks=True), (nan_at(q, 2),), "q must be finite"),
    "log_g": (
        lambda g: power_retention(q, kv, kv, g, debug_checks=True),
        (jnp.zeros((1, 5, 2)).at[0, 3, 1].set(0.5),),
        r"log_g must be <= 0 and not NaN \(debug_checks\), got 1 positive or NaN",
    ),
    "k": (
        lambda k: power_retention_step(init_state(1, 2, 8), q, k, kv, debug_checks=True),
        (kv.at[0, 1].set(jnp.inf),),
        "k must be finite",
    ),
    "state": (
        lambda S: power_retention_step(RetentionState(S, init_state(1, 2, 8).z), q, kv, kv, debug_checks=True),
        (init_state(1, 2, 8).S.at[0, 1, 3].set(jnp.nan),),
        r"state.S must be finite \(debug_checks\), got 8 NaN or inf",
    ),
    "v": (lambda v: softmax_attention(q, kv, v, debug_checks=True), (nan_at(kv, 4),), "v must be finite"),
    "segment_ids": (
        lambda seg: power_retention(q, kv, kv, segment_ids=seg, debug_checks=True),
        (jnp.asarray([[3, 4, 3, 3, 3]], jnp.int32),),
        "segment_ids must keep each document contiguous",
    ),
    "overflow": (
        lambda cache: softmax_attention_step(cache, q[:, :1], kv[:, :1], kv[:, :1], debug_checks=True),
        _full_cache,
        r"cache overflows \(debug_checks\): a full-attention cache of max_len=16 would hold 17 tokens",
    ),
}


@pytest.mark.parametrize("name", DEBUG_CASES)
def test_debug_checks_raise_under_jit(name):
    """Values only known at run time (jit arguments): debug_checks=True raises, naming the argument (the host
    callback's ValueError inside the runtime error jit raises)."""
    fn, args, match = DEBUG_CASES[name]
    arg = args() if callable(args) else args[0]
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(jax.jit(fn)(arg))


_float_cache = init_kv_cache(1, 2, 8, 16)
_quantized_cache = init_quantized_kv_cache(1, 2, 8, 16, 8, group=8)
CACHE_CASES = {
    "tuple": (tuple(_float_cache), TypeError, r"cache must be a KVCache \(see init_kv_cache\), got tuple"),
    "k head dim": (
        _float_cache._replace(k=_float_cache.k[..., :4]),
        ValueError,
        r"cache.k must be \[B, H, L, d\] = \[1, 2, L, 8\] in float32: .* got \(1, 2, 16, 4\) float32",
    ),
    "v heads": (_float_cache._replace(v=_float_cache.v[:, :1]), ValueError, r"cache.v must be \[B, H, L, d\]"),
    "k dtype": (
        _float_cache._replace(k=_float_cache.k.astype(jnp.bfloat16)),
        ValueError,
        "cache.k must be .* in float32: a cache must match on B, H, d and dtype",
    ),
    "pos": (_float_cache._replace(pos=_float_cache.pos[:3]), ValueError, r"cache.pos must be an int array of shape"),
    "segment_ids": (
        _float_cache._replace(segment_ids=_float_cache.segment_ids[:, :15]),
        ValueError,
        r"cache.segment_ids must be an int array \[B, L\] = \(1, 16\), got \(1, 15\) int32",
    ),
    "length float": (_float_cache._replace(length=jnp.float32(0)), ValueError, "cache.length must be an int array"),
    "length -5": (_float_cache._replace(length=jnp.int32(-5)), ValueError, r"cache.length must be >= 0 .* got -5"),
    "length past max_len": (
        _float_cache._replace(length=jnp.int32(40)),
        ValueError,
        r"a full-attention cache needs max_len >= its length \+ n = 40 \+ 1, got max_len=16",
    ),
    "quantized tuple": (
        tuple(_quantized_cache),
        TypeError,
        r"cache must be a QuantizedKVCache \(see init_quantized_kv_cache\), got tuple",
    ),
    "quantized k": (
        _quantized_cache._replace(k=_quantized_cache.k[..., :5]),
        ValueError,
        r"cache.k must be \[B, H, L, d\] = \[1, 2, L, 8\] int8 .* got \(1, 2, 16, 5\) int8",
    ),
    "quantized v dtype": (
        _quantized_cache._replace(v=_quantized_cache.v.astype(jnp.uint8)),
        ValueError,
        "cache.v must",
    ),
    "quantized scale": (
        _quantized_cache._replace(k_scale=_quantized_cache.k_scale.astype(jnp.float32)),
        ValueError,
        r"cache.k_scale must be bfloat16 \[B, H, L, d / group\]",
    ),
    "quantized length -5": (
        _quantized_cache._replace(length=jnp.int32(-5)),
        ValueError,
        r"cache.length must be >= 0 .* got -5",
    ),
}


@pytest.mark.parametrize("case", list(CACHE_CASES))
def test_kv_caches_of_another_type_shape_or_length_are_refused(case):
    """A tuple cache failed with "'tuple' object has no attribute 'k'", a wrong shape deep in JAX (slice_sizes),
    and length -5 was accepted; each now raises naming the field. Under jit the shapes are checked alike."""
    cache, err, match = CACHE_CASES[case]
    one = [jnp.ones((1, 1, h, 8), jnp.float32) for h in (4, 2, 2)]
    step = softmax_attention_step_quantized if case.startswith("quantized") else softmax_attention_step
    with pytest.raises(err, match=match):
        step(cache, *one)
    if "length" not in case:
        with pytest.raises(err, match=match):
            jax.jit(step)(cache, *one)


def test_a_state_of_another_type_is_refused():
    state = init_state(1, 2, 8)
    one = [jnp.ones((1, 1, h, 8), jnp.float32) for h in (4, 2, 2)]
    with pytest.raises(TypeError, match=r"state must be a RetentionState\(S, z\) \(see init_state\), got tuple"):
        power_retention_step(tuple(state), *one)
    with pytest.raises(TypeError, match=r"state must be a RetentionState\(S, z\) .* got list"):
        power_retention_step(list(state), *one)
