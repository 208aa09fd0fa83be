"""Softmax-attention decode against a quantized KV cache: int8 or 4-bit keys and values, one bfloat16 scale per
group of `group` consecutive values along the head dim (symmetric, round to nearest).

A group x of `group` values is stored as q = round(x / s), |q| <= qmax = 2^(bits-1) - 1, with s = max|x| / qmax
rounded *up* to bfloat16 (so no q is clipped); each value then errs by at most s / 2 <= max|x| / qmax * (1 + 2^-7)
/ 2. 4-bit values are packed two per uint8 (q + 8 in each nibble), so the arrays hold the real bytes, which
`cache_bytes` counts: per value, bits + 16 / group bits (int8: 9, 4-bit: 5 at group 16; 4.5 at group 32).

The cache's dtype says its bits: int8 arrays are 8-bit, uint8 arrays are packed 4-bit. A decode step quantizes
the new keys and values, attends to the dequantized cache and to the new tokens as they will be read back (so n
tokens in one step equal n steps of one), then writes them. It dequantizes the cache into a float temporary of
the float cache's size each step; the stored bytes are the quantized ones.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float, Int, Shaped

from retention.ops.attention.decode import KVCache, check_cache_slots, describe_array, softmax_attention_step
from retention.ops.attention.scores import poison_nonfinite_kv
from retention.ops.validation import check_qkv
from retention.validation import check_choice, check_int

KV_CACHE_BITS = (8, 4)
STORAGE = {8: jnp.int8, 4: jnp.uint8}  # 4-bit values two per byte
DEFAULT_GROUP = 16


class QuantizedKVCache(NamedTuple):
    """Quantized keys and values with their scales; slots, pos and length as `KVCache`'s (a ring buffer when
    shorter than the sequence).

    Attributes:
        k: keys [B, H, L, d] int8 (8-bit) or [B, H, L, d / 2] uint8 (4-bit, two values a byte).
        k_scale: the keys' scales [B, H, L, d / group], bfloat16.
        v: values, as k.
        v_scale: the values' scales, as k_scale.
        pos: the absolute position each slot holds [L], -1 when empty.
        length: the tokens written so far, a scalar.
    """

    k: Shaped[Array, "B H L c"]
    k_scale: Float[Array, "B H L groups"]
    v: Shaped[Array, "B H L c"]
    v_scale: Float[Array, "B H L groups"]
    pos: Int[Array, " L"]
    length: Int[Array, ""]


def default_group(head_dim: int) -> int:
    """Values per scale for a head dim: 16, or the largest divisor of head_dim among 1, 2, 4, 8 when 16 does not
    divide it."""
    return math.gcd(DEFAULT_GROUP, head_dim)


def check_quantization(head_dim: int, bits: int, group: int) -> None:
    """bits is 8 or 4; group an int >= 1 dividing head_dim; 4 bits need an even head_dim (two values a byte)."""
    check_int("head_dim", head_dim)
    check_choice("bits", bits, KV_CACHE_BITS)
    check_int("group", group)
    if head_dim % group:
        raise ValueError(f"group must divide head_dim={head_dim}, got {group}")
    if bits == 4 and head_dim % 2:
        raise ValueError(f"4-bit values are packed two per byte: head_dim must be even, got {head_dim}")


def check_quantized_kv_cache(cache, k, name: str = "cache") -> None:
    """`cache` is a QuantizedKVCache for the new keys k [B, n, H, d]: k and v [B, H, L, d] int8 or [B, H, L, d / 2]
    uint8 (one dtype), k_scale and v_scale [B, H, L, d / group] bfloat16 with group dividing d, pos and length as
    `check_cache_slots`. Raises TypeError or ValueError naming the argument."""
    if not isinstance(cache, QuantizedKVCache):
        raise TypeError(f"{name} must be a QuantizedKVCache (see init_quantized_kv_cache), got {type(cache).__name__}")
    B, _, H, d = k.shape
    for field in ("k", "v"):
        x = getattr(cache, field)
        bits = {jnp.dtype(jnp.int8): 8, jnp.dtype(jnp.uint8): 4}.get(getattr(x, "dtype", None))
        if bits is None or x.ndim != 4 or x.shape[:2] != (B, H) or x.shape[3] != d * bits // 8 or d * bits % 8:
            raise ValueError(
                f"{name}.{field} must be [B, H, L, d] = [{B}, {H}, L, {d}] int8 or [{B}, {H}, L, {d} / 2] uint8 "
                f"(4-bit): a cache must match on B, H and d the new k {tuple(k.shape)}, got {describe_array(x)}"
            )
    if cache.v.shape != cache.k.shape or cache.v.dtype != cache.k.dtype:
        want, got = describe_array(cache.k), describe_array(cache.v)
        raise ValueError(f"{name}.v must have {name}.k's shape and dtype {want}, got {got}")
    L = check_cache_slots(cache, name, B)
    for field in ("k_scale", "v_scale"):
        x = getattr(cache, field)
        ok = getattr(x, "ndim", None) == 4 and x.shape[:3] == (B, H, L) and x.shape[3] >= 1 and d % x.shape[3] == 0
        if not ok or x.dtype != jnp.bfloat16 or x.shape != cache.k_scale.shape:
            raise ValueError(
                f"{name}.{field} must be bfloat16 [B, H, L, d / group] = [{B}, {H}, {L}, d / group] with group "
                f"dividing d={d} (as k_scale), got {describe_array(x)}"
            )


def cache_bits(cache: QuantizedKVCache) -> int:
    """8 for an int8 cache, 4 for a packed uint8 one."""
    return 8 if cache.k.dtype == jnp.int8 else 4


def cache_group(cache: QuantizedKVCache) -> int:
    """Values per scale: the head dim over the number of scales."""
    d = cache.k.shape[-1] * (8 // cache_bits(cache))
    return d // cache.k_scale.shape[-1]


def quantize(x: Float[Array, "*b d"], bits: int, group: int = DEFAULT_GROUP):
    """(q, scale): q [*b, d] int8 or [*b, d / 2] uint8 (4 bits packed), scale [*b, d / group] bfloat16, so that
    `dequantize(q, scale)` errs by at most scale / 2 per value. A non-finite value makes its group's scale
    non-finite, so the group dequantizes to NaN or inf, never to silent zeros."""
    check_quantization(x.shape[-1], bits, group)
    qmax = 2 ** (bits - 1) - 1
    x_g = rearrange(x.astype(jnp.float32), "... (n g) -> ... n g", g=group)
    exact = jnp.max(jnp.abs(x_g), axis=-1) / qmax
    scale = exact.astype(jnp.bfloat16)
    scale = jnp.where(scale.astype(jnp.float32) < exact, jnp.nextafter(scale, jnp.bfloat16(jnp.inf)), scale)
    inverse = jnp.where(scale > 0, 1 / scale.astype(jnp.float32), 0.0)
    q = jnp.clip(jnp.round(x_g * inverse[..., None]), -qmax, qmax)
    q = rearrange(q, "... n g -> ... (n g)")
    if bits == 8:
        return q.astype(jnp.int8), scale
    nibbles = rearrange((q + 8).astype(jnp.uint8), "... (c two) -> ... c two", two=2)
    return nibbles[..., 0] | (nibbles[..., 1] << 4), scale


def dequantize(q: Shaped[Array, "*b c"], scale: Float[Array, "*b groups"], dtype=jnp.float32) -> Float[Array, "*b d"]:
    """The values [*b, d] in `dtype` of `quantize`'s (q, scale); int8 q is 8-bit, uint8 q packed 4-bit."""
    if q.dtype == jnp.int8:
        values = q.astype(jnp.float32)
    else:
        pairs = jnp.stack([q & 15, q >> 4], axis=-1).astype(jnp.float32) - 8
        values = rearrange(pairs, "... c two -> ... (c two)")
    groups = scale.shape[-1]
    x_g = rearrange(values, "... (n g) -> ... n g", n=groups) * scale.astype(jnp.float32)[..., None]
    return rearrange(x_g, "... n g -> ... (n g)").astype(dtype)


def init_quantized_kv_cache(
    batch: int, heads: int, head_dim: int, max_len: int, bits: int, group: int = DEFAULT_GROUP
) -> QuantizedKVCache:
    """An empty quantized cache of `max_len` slots (heads before slots, as `init_kv_cache`).

    Args:
        batch: rows B.
        heads: kv-heads H.
        head_dim: d.
        max_len: slots L, as in `init_kv_cache`.
        bits: 8 (int8) or 4 (4-bit), one of KV_CACHE_BITS.
        group: values sharing one bfloat16 scale; must divide head_dim.

    Returns:
        The empty cache: 9 bits a value at 8 bits, 5 at 4 (group 16).
    """
    for name, value in (("batch", batch), ("heads", heads), ("max_len", max_len)):
        check_int(name, value)
    check_quantization(head_dim, bits, group)
    values = lambda: jnp.zeros((batch, heads, max_len, head_dim * bits // 8), STORAGE[bits])
    scales = lambda: jnp.zeros((batch, heads, max_len, head_dim // group), jnp.bfloat16)
    pos = jnp.full((max_len,), -1, jnp.int32)
    return QuantizedKVCache(values(), scales(), values(), scales(), pos, jnp.zeros((), jnp.int32))


def dequantized(cache: QuantizedKVCache, dtype) -> KVCache:
    """The float KVCache in `dtype` that `cache` holds (one document per row: every slot's segment id 0)."""
    k, v = dequantize(cache.k, cache.k_scale, dtype), dequantize(cache.v, cache.v_scale, dtype)
    segment_ids = jnp.zeros(cache.k.shape[:1] + cache.k.shape[2:3], jnp.int32)  # [B, L]
    return KVCache(k=k, v=v, pos=cache.pos, segment_ids=segment_ids, length=cache.length)


def _write(cache: QuantizedKVCache, k_BHnd, v_BHnd, new_pos) -> QuantizedKVCache:
    """Quantize n tokens' keys and values [B, H, n, d] (a token with a non-finite one poisoned first, as the float
    cache stores it: k all NaN, v 0) and write them at slots new_pos % L."""
    bits, group, L = cache_bits(cache), cache_group(cache), cache.k.shape[2]
    k_BHnd, v_BHnd = poison_nonfinite_kv(k_BHnd, v_BHnd)
    arrays = (*quantize(k_BHnd, bits, group), *quantize(v_BHnd, bits, group))
    slots = new_pos % L
    if new_pos.shape[0] == 1:
        put = lambda old, new: jax.lax.dynamic_update_slice_in_dim(old, new, slots[0], axis=2)
    else:
        put = lambda old, new: old.at[:, :, slots].set(new)
    k, k_scale, v, v_scale = (put(old, new) for old, new in zip(cache[:4], arrays))
    return QuantizedKVCache(k, k_scale, v, v_scale, cache.pos.at[slots].set(new_pos), cache.length + new_pos.shape[0])


def fill_quantized_kv_cache(
    cache: QuantizedKVCache, k: Float[Array, "B T H d"], v: Float[Array, "B T H d"]
) -> QuantizedKVCache:
    """A prompt's keys and values (positions 0..T-1) into an empty cache: the last min(T, L) of them, quantized."""
    check_quantized_kv_cache(cache, k)
    T, L = k.shape[1], cache.k.shape[2]
    kept = min(T, L)
    to_heads = lambda x: rearrange(x[:, T - kept :], "B n H d -> B H n d")
    return _write(
        cache._replace(length=jnp.asarray(T - kept, jnp.int32)),
        to_heads(k),
        to_heads(v),
        jnp.arange(T - kept, T, dtype=jnp.int32),
    )


@jax.named_scope("softmax_attention_step_quantized")
def softmax_attention_step_quantized(
    cache: QuantizedKVCache,
    q: Float[Array, "B n Hq d"],
    k: Float[Array, "B n H d"],
    v: Float[Array, "B n H d"],
    *,
    window: int | None = None,
    scale: float | None = None,
) -> tuple[Float[Array, "B n Hq d"], QuantizedKVCache]:
    """`softmax_attention_step` against a quantized cache.

    The n new keys and values are quantized, every query attends to the dequantized keys and values it may see
    (the new ones as they will be read back), and the new tokens are written. Row i equals dense attention over the
    dequantized keys and values of the whole sequence under the same conditions as the float step (max_len >=
    total length, or >= window + n - 1).

    Args:
        cache: the quantized keys and values of the tokens before these (`init_quantized_kv_cache` for none).
        q: queries [B, n, Hq, d].
        k: keys [B, n, H, d].
        v: values [B, n, H, d].
        window: as in `softmax_attention`.
        scale: None is d^-0.5.

    Returns:
        y: [B, n, Hq, d] in v's dtype.
        cache: the cache holding the new tokens too.
    """
    check_qkv(q, k, v)
    check_quantized_kv_cache(cache, k)
    n = k.shape[1]
    bits, group = cache_bits(cache), cache_group(cache)
    k, v = poison_nonfinite_kv(k, v)  # before quantizing: a token's inf poisons its whole key, not its group
    k_hat, v_hat = (dequantize(*quantize(x, bits, group), dtype=x.dtype) for x in (k, v))
    y, _ = softmax_attention_step(dequantized(cache, k.dtype), q, k_hat, v_hat, window=window, scale=scale)
    new_pos = cache.length + jnp.arange(n, dtype=jnp.int32)
    to_heads = lambda x: rearrange(x, "B n H d -> B H n d")
    return y, _write(cache, to_heads(k), to_heads(v), new_pos)
