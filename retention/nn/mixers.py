"""Sequence mixers as Flax NNX modules: power retention and softmax attention (full or sliding window).

Both map x [B, T, D] to y [B, T, D] with `__call__(x, *, positions, segment_ids=None, cache=None) -> (y, cache)`:
- cache=None: one full-sequence forward, returns (y, None);
- with a cache: the T tokens continue the sequence held in the cache (a decode step of T >= 1 tokens). For
  retention that is one call of the step op, `power_retention_step`, which runs the T tokens as one chunk against
  the state up to the chunk size and the chunked op from the state beyond;
- `prefill(x, *, positions, segment_ids=None, cache)`: a whole prompt into an empty cache. Attention runs the
  full-sequence op and writes the keys and values; retention is the call with the cache (the step op, as above).
Under a mesh whose "sequence" axis splits the tokens (`jax.set_mesh`, as the trainer does), the full forward
runs the context-parallel ops (`power_retention_context_parallel`, `softmax_attention_context_parallel`); the
results are the same.
A retention cache is a RetentionCache: the RetentionState (S [B, H, D, d], z [B, H, D], float32, the same size at
any length), each row's last segment id and, with `conv_size`, the short convolution's last conv_size - 1 inputs
and their segment ids (retention/nn/conv.py); an attention cache is an AttentionCache: a KVCache of keys and values
and each slot's segment id per row (a ring buffer of window + n - 1 slots for a sliding window), or with
`kv_cache_bits` (8 or 4) a QuantizedKVCache of the same slots (retention/ops/attention/quantized.py; one document
per row: it keeps no segment ids), and the same conv cache.
Packed documents: `segment_ids` [B, T] (equal ids form one document, contiguous in time) keep documents apart in
every op and in the convolution. With a cache, None continues each row's last document; a step whose first token
has an id other than the row's last one starts a new document there (an id that comes back too:
`retention.ops.segments`): the retention mixer clears that row's state (its cache records the last id), attention
sees only the keys since the query's document started, and the convolution drops the taps of the earlier document.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from retention.nn.conv import QKVConv, QKVConvCache, check_conv_size
from retention.nn.layers import QKNorm, apply_rope, check_heads, check_rope_base
from retention.ops import (
    ATTENTION_IMPLS,
    RETENTION_IMPLS,
    KVCache,
    RetentionState,
    check_chunk_size,
    check_deg,
    init_kv_cache,
    init_state,
    power_retention,
    power_retention_context_parallel,
    power_retention_step,
    sequence_parallel_size,
    softmax_attention,
    softmax_attention_context_parallel,
    softmax_attention_step,
)
from retention.ops.attention import (
    QuantizedKVCache,
    check_window,
    fill_quantized_kv_cache,
    init_quantized_kv_cache,
    softmax_attention_step_quantized,
)
from retention.ops.attention.quantized import check_quantization, default_group
from retention.ops.power_retention.state import clear_rows
from retention.validation import check_choice, check_int, check_number

GATE_BIAS_INIT = 4.0  # gates start near sigmoid(4) = 0.98: a slow decay that training can sharpen


class RetentionCache(NamedTuple):
    """A power-retention layer's decode cache: its state, each row's last segment id (to see a new document
    coming) and the conv cache (None without a convolution)."""

    state: RetentionState
    segment_id: Int[Array, " B"]
    conv: QKVConvCache | None


class AttentionCache(NamedTuple):
    """An attention layer's decode cache: its keys and values (KVCache, or QuantizedKVCache with kv_cache_bits)
    and the conv cache (None without a convolution)."""

    kv: KVCache | QuantizedKVCache
    conv: QKVConvCache | None


def make_qkv_parts(heads, kv_heads, head_dim, conv_size, qk_norm, *, dtype, param_dtype, rngs):
    """The optional pieces between the projections and the op: (QKVConv or None, QKNorm or None)."""
    check_conv_size("conv_size", conv_size)
    conv = (
        QKVConv(heads * head_dim, kv_heads * head_dim, conv_size, param_dtype=param_dtype, rngs=rngs)
        if conv_size
        else None
    )
    norm = QKNorm(head_dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs) if qk_norm else None
    return conv, norm


def project_qkv(mixer, x_BTD, positions, segment_ids, conv_cache, decode: bool):
    """q [B, T, Hq, d], k and v [B, T, H, d] of either mixer: projections, the short convolution (continuing
    `conv_cache` when decoding; within each document of segment_ids [B, T] or None), QK RMSNorm and RoPE as
    configured; and the new conv cache (None when not decoding or without a convolution)."""
    B, T, _ = x_BTD.shape
    q, k, v = mixer.q_proj(x_BTD), mixer.k_proj(x_BTD), mixer.v_proj(x_BTD)
    if mixer.conv is not None:
        q, k, v, conv_cache = mixer.conv(q, k, v, segment_ids_BT=segment_ids, cache=conv_cache if decode else None)
    q = q.reshape(B, T, mixer.heads, mixer.head_dim)
    k = k.reshape(B, T, mixer.kv_heads, mixer.head_dim)
    v = v.reshape(B, T, mixer.kv_heads, mixer.head_dim)
    if mixer.qk_norm is not None:
        q, k = mixer.qk_norm(q, k)
    if mixer.rope_base is not None:
        q, k = apply_rope(q, positions, mixer.rope_base), apply_rope(k, positions, mixer.rope_base)
    return q, k, v, conv_cache


def cache_bytes(cache) -> int:
    """Total bytes of the arrays (or jax.ShapeDtypeStructs, e.g. from jax.eval_shape) in a cache pytree."""
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(cache))


class PowerRetention(nnx.Module):
    """Power retention mixer: q, k, v projections (GQA), an optional causal short convolution on each (conv_size
    taps, 0: none), optional QK RMSNorm and RoPE, optional per-kv-head gate log_g = log_sigmoid(x W_g + b_g) with
    b_g initialised to gate_bias_init, the power retention op, and the output projection. `impl` is the op's (one
    of RETENTION_IMPLS), passed through: "reference" has no state, so it serves the full forward only."""

    def __init__(
        self,
        d_model: int,
        *,
        heads: int,
        kv_heads: int,
        head_dim: int,
        deg: int = 2,
        gating: bool = True,
        gate_bias_init: float = GATE_BIAS_INIT,
        qk_norm: bool = False,
        conv_size: int = 0,
        rope_base: float | None = None,
        chunk_size: int | None = None,
        impl: str = "auto",
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        check_int("d_model", d_model)
        check_heads(heads, kv_heads, head_dim)
        check_rope_base(rope_base, head_dim)
        check_deg(deg)
        check_number("gate_bias_init", gate_bias_init)
        check_chunk_size(chunk_size)
        check_choice("impl", impl, RETENTION_IMPLS)
        self.heads, self.kv_heads, self.head_dim, self.deg = heads, kv_heads, head_dim, deg
        self.rope_base, self.chunk_size, self.impl = rope_base, chunk_size, impl
        linear = lambda i, o: nnx.Linear(i, o, use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q_proj = linear(d_model, heads * head_dim)
        self.k_proj = linear(d_model, kv_heads * head_dim)
        self.v_proj = linear(d_model, kv_heads * head_dim)
        self.o_proj = linear(heads * head_dim, d_model)
        self.gate_proj = (
            nnx.Linear(
                d_model,
                kv_heads,
                bias_init=nnx.initializers.constant(gate_bias_init),
                dtype=jnp.float32,
                param_dtype=param_dtype,
                rngs=rngs,
            )
            if gating
            else None
        )
        self.conv, self.qk_norm = make_qkv_parts(
            heads, kv_heads, head_dim, conv_size, qk_norm, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )

    def __call__(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"],
        segment_ids: Int[Array, "B T"] | None = None,
        cache: RetentionCache | None = None,
    ) -> tuple[Float[Array, "B T D"], RetentionCache | None]:
        """Full forward (cache=None: the op, or its context-parallel form under a mesh that splits the sequence) or
        T tokens continuing the cache (the step op; rows whose first token starts a new document begin from an
        empty state). segment_ids enter here, and only here. Returns (y [B, T, D], the new cache or None)."""
        B, T, _ = x_BTD.shape
        decode = cache is not None
        q, k, v, conv_cache = project_qkv(self, x_BTD, positions, segment_ids, cache.conv if decode else None, decode)
        log_g = None if self.gate_proj is None else jax.nn.log_sigmoid(self.gate_proj(x_BTD))
        options = dict(segment_ids=segment_ids, deg=self.deg, chunk_size=self.chunk_size, impl=self.impl)
        if decode:
            state, last_id = cache.state, cache.segment_id
            if segment_ids is not None:
                state = clear_rows(state, segment_ids[:, 0] != last_id)
                last_id = segment_ids[:, -1].astype(jnp.int32)
                options["segment_ids"] = segment_ids if T > 1 else None  # one token holds no document start
            y, state = power_retention_step(state, q, k, v, log_g, **options)
            cache = RetentionCache(state, last_id, conv_cache)
        elif sequence_parallel_size() > 1:
            y = power_retention_context_parallel(q, k, v, log_g, **options)
        else:
            y = power_retention(q, k, v, log_g, **options)
        return self.o_proj(y.reshape(B, T, self.heads * self.head_dim)), cache

    def prefill(self, x_BTD, *, positions, segment_ids=None, cache: RetentionCache):
        """A prompt into a fresh cache: the same as a call with the cache (the step op: one chunk against the state
        up to the chunk size, the chunked op from the state beyond)."""
        return self(x_BTD, positions=positions, segment_ids=segment_ids, cache=cache)

    def init_cache(self, batch: int, max_len: int, dtype=None, *, step_tokens: int = 1) -> RetentionCache:
        """An empty state, S [batch, H, D, d] and z [batch, H, D] in float32, last segment ids 0 [batch], and the
        conv cache in `dtype` (None: float32): its size does not depend on max_len or step_tokens (taken for the
        common mixer interface)."""
        check_int("batch", batch)
        check_int("max_len", max_len)
        state = init_state(batch, self.kv_heads, self.head_dim, self.deg)
        conv = None if self.conv is None else self.conv.init_cache(batch, jnp.float32 if dtype is None else dtype)
        return RetentionCache(state, jnp.zeros((batch,), jnp.int32), conv)


def _check_one_document(segment_ids) -> None:
    """A quantized KV cache holds one document per row (no segment ids): refuse packed or ragged inputs."""
    if segment_ids is not None:
        raise NotImplementedError(
            "segment_ids (packed documents, ragged prompts) with a quantized KV cache (kv_cache_bits) are not "
            "supported: use kv_cache_bits=None or one document per row"
        )


class Attention(nnx.Module):
    """Causal softmax attention mixer, full or over a sliding window of `window` tokens: q, k, v projections
    (GQA), an optional causal short convolution on each (conv_size taps, 0: none), optional QK RMSNorm and RoPE,
    the softmax op, and the output projection. `impl` is the full-sequence op's (one of ATTENTION_IMPLS); the
    decode step and the context-parallel op have one implementation each. `kv_cache_bits` (None, 8 or 4): the
    decode cache's keys and values in float (None) or quantized (int8 / 4-bit, a bfloat16 scale per 16 values, or
    per gcd(16, head_dim)); prefill runs in float and stores the prompt quantized."""

    def __init__(
        self,
        d_model: int,
        *,
        heads: int,
        kv_heads: int,
        head_dim: int,
        window: int | None = None,
        qk_norm: bool = False,
        conv_size: int = 0,
        rope_base: float | None = 10000.0,
        impl: str = "auto",
        kv_cache_bits: int | None = None,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        check_int("d_model", d_model)
        check_heads(heads, kv_heads, head_dim)
        check_rope_base(rope_base, head_dim)
        check_window(window)
        if kv_cache_bits is not None:
            check_quantization(head_dim, kv_cache_bits, default_group(head_dim))
        self.kv_cache_bits = kv_cache_bits
        check_choice("impl", impl, ATTENTION_IMPLS)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.window, self.rope_base, self.impl = window, rope_base, impl
        linear = lambda i, o: nnx.Linear(i, o, use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q_proj = linear(d_model, heads * head_dim)
        self.k_proj = linear(d_model, kv_heads * head_dim)
        self.v_proj = linear(d_model, kv_heads * head_dim)
        self.o_proj = linear(heads * head_dim, d_model)
        self.conv, self.qk_norm = make_qkv_parts(
            heads, kv_heads, head_dim, conv_size, qk_norm, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )

    def _out(self, y_BTHd):
        B, T = y_BTHd.shape[:2]
        return self.o_proj(y_BTHd.reshape(B, T, self.heads * self.head_dim))

    def __call__(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"],
        segment_ids: Int[Array, "B T"] | None = None,
        cache: AttentionCache | None = None,
    ) -> tuple[Float[Array, "B T D"], AttentionCache | None]:
        """Full causal forward (cache=None), or T tokens written into the cache and attending to what it holds;
        segment_ids enter here, and only here. Returns (y [B, T, D], the updated cache or None)."""
        decode = cache is not None
        q, k, v, conv_cache = project_qkv(self, x_BTD, positions, segment_ids, cache.conv if decode else None, decode)
        options = dict(window=self.window, segment_ids=segment_ids)
        if not decode and sequence_parallel_size() > 1:  # under a mesh that splits the sequence: gather K, V
            return self._out(softmax_attention_context_parallel(q, k, v, **options)), None
        if not decode:
            return self._out(softmax_attention(q, k, v, **options, impl=self.impl)), None
        if isinstance(cache.kv, QuantizedKVCache):
            _check_one_document(segment_ids)
            y, kv = softmax_attention_step_quantized(cache.kv, q, k, v, window=self.window)
        else:
            y, kv = softmax_attention_step(cache.kv, q, k, v, **options)
        return self._out(y), AttentionCache(kv, conv_cache)

    def prefill(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"],
        segment_ids: Int[Array, "B T"] | None = None,
        cache: AttentionCache,
    ) -> tuple[Float[Array, "B T D"], AttentionCache]:
        """A whole prompt at stream positions 0..T-1 into an empty cache (positions: RoPE's): the full-sequence op
        for y, then the last min(T, slots) keys, values and segment ids written at slots position % slots (a full
        cache must hold all T)."""
        B, T = x_BTD.shape[:2]
        kv = cache.kv
        L = kv.k.shape[2]  # k is [B, H, L, d]
        if self.window is None and L < T:
            raise ValueError(f"a full-attention cache needs max_len >= the prompt length {T}, got max_len={L}")
        q, k, v, conv_cache = project_qkv(self, x_BTD, positions, segment_ids, cache.conv, decode=True)
        y = softmax_attention(q, k, v, window=self.window, segment_ids=segment_ids, impl=self.impl)
        if isinstance(kv, QuantizedKVCache):
            _check_one_document(segment_ids)
            return self._out(y), AttentionCache(fill_quantized_kv_cache(kv, k, v), conv_cache)
        kept = min(T, L)
        pos = jnp.arange(T - kept, T, dtype=jnp.int32)
        seg = jnp.zeros((B, T), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
        kv = KVCache(
            k=kv.k.at[:, :, pos % L].set(jnp.swapaxes(k[:, T - kept :], 1, 2).astype(kv.k.dtype)),
            v=kv.v.at[:, :, pos % L].set(jnp.swapaxes(v[:, T - kept :], 1, 2).astype(kv.v.dtype)),
            pos=kv.pos.at[pos % L].set(pos),
            segment_ids=kv.segment_ids.at[:, pos % L].set(seg[:, T - kept :]),
            length=jnp.asarray(T, jnp.int32),
        )
        return self._out(y), AttentionCache(kv, conv_cache)

    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32, *, step_tokens: int = 1) -> AttentionCache:
        """An empty KV cache: max_len slots for full attention; window + step_tokens - 1 for a sliding window
        (a ring buffer: enough for decode steps of up to step_tokens tokens, at any length), quantized with
        kv_cache_bits; and the conv cache."""
        check_int("max_len", max_len)
        check_int("step_tokens", step_tokens)
        slots = max_len if self.window is None else self.window + step_tokens - 1
        if self.kv_cache_bits is not None:
            group = default_group(self.head_dim)
            kv = init_quantized_kv_cache(batch, self.kv_heads, self.head_dim, slots, self.kv_cache_bits, group)
        else:
            kv = init_kv_cache(batch, self.kv_heads, self.head_dim, slots, dtype)
        return AttentionCache(kv, None if self.conv is None else self.conv.init_cache(batch, dtype))
