"""The softmax-attention mixer, full (layer letter A) or over a sliding window (W), and their registry entries.

The `Mixer` methods (mixer_interface.py): `__call__(x, *, positions, segment_ids=None) -> y` is one full-sequence
forward (the context-parallel op, which gathers K and V, under a mesh whose "sequence" axis splits the tokens);
`decode(x, *, ..., cache) -> (y, cache)` writes the T tokens into the cache and attends to what it holds; `verify`
does the same and keeps the conv caches per token; `prefill` runs the full-sequence op on a prompt and writes its
keys and values into an empty cache.
Its cache is an AttentionCache: a KVCache of keys and values and each slot's segment id per row (a ring buffer of
window + n - 1 slots for a sliding window), or with `kv_cache_bits` (8 or 4) a QuantizedKVCache of the same slots
(retention/ops/attention/quantized.py; one document per row: it keeps no segment ids), and the conv cache. With a
cache, segment_ids None continues each row's last document; attention sees only the keys since the query's
document started (an id that comes back starts a new one: `retention.ops.segments`).
"""

from typing import NamedTuple

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from retention.nn.conv import QKVConvCache
from retention.nn.mixer_kind import MixerKind
from retention.nn.qkv import (
    QKVMixer,
    conv_cache_bytes,
    conv_taps,
    mixer_options,
    project_qkv,
    qkv_part_params,
    qkvo_weights,
    select_kept,
)
from retention.nn.rope import RopeScaling
from retention.ops import (
    ATTENTION_IMPLS,
    KVCache,
    context_parallel_size,
    init_kv_cache,
    softmax_attention,
    softmax_attention_context_parallel,
    softmax_attention_step,
)
from retention.ops.attention import (
    QuantizedKVCache,
    check_window,
    fill_kv_cache,
    fill_quantized_kv_cache,
    init_quantized_kv_cache,
    softmax_attention_step_quantized,
)
from retention.ops.attention.decode import keep_first
from retention.ops.attention.quantized import check_quantization, default_group
from retention.validation import check_choice, check_int


class AttentionCache(NamedTuple):
    """An attention layer's decode cache.

    Attributes:
        kv: its keys and values: a KVCache, or a QuantizedKVCache with kv_cache_bits.
        conv: the last conv_size - 1 inputs of q, k and v; None without a convolution.
    """

    kv: KVCache | QuantizedKVCache
    conv: QKVConvCache | None


def _check_one_document(segment_ids) -> None:
    """A quantized KV cache holds one document per row (no segment ids): refuse packed or ragged inputs."""
    if segment_ids is not None:
        raise NotImplementedError(
            "segment_ids (packed documents, ragged prompts) with a quantized KV cache (kv_cache_bits) are not "
            "supported: use kv_cache_bits=None or one document per row"
        )


class Attention(QKVMixer):
    """Causal softmax attention mixer, full or over a sliding window: q, k, v projections (GQA), an optional causal
    short convolution on each, optional QK RMSNorm and RoPE, the softmax op, and the output projection.

    Args:
        d_model: the model width.
        heads: query heads Hq.
        kv_heads: key/value heads H, dividing Hq.
        head_dim: d.
        window: a sliding window of this many tokens; None: full attention.
        qk_norm: RMSNorm over the head dim of q and k.
        conv_size: taps of the short convolution on q, k and v; 0: none.
        qkv_bias: biases on the q, k and v projections (as Qwen2).
        norm_eps: the RMSNorms' epsilon.
        rope_scaling: RoPE's frequency scaling, or None.
        rope_base: RoPE's base; None: no RoPE.
        impl: the full-sequence op's (one of ATTENTION_IMPLS); the decode step and the context-parallel op have one
            implementation each.
        kv_cache_bits: the decode cache's keys and values in float (None) or quantized (8: int8, 4: 4-bit; a bfloat16
            scale per 16 values, or per gcd(16, head_dim)); prefill runs in float and stores the prompt quantized.
        dtype (DTypeLike): the compute dtype, and the KV cache's.
        param_dtype (DTypeLike): the parameters' dtype.
        rngs: the initialisation.
    """

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
        qkv_bias: bool = False,
        norm_eps: float = 1e-6,
        rope_scaling: RopeScaling | None = None,
        rope_base: float | None = 10000.0,
        impl: str = "auto",
        kv_cache_bits: int | None = None,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        check_window(window)
        check_choice("impl", impl, ATTENTION_IMPLS)
        parts = dict(qk_norm=qk_norm, conv_size=conv_size, qkv_bias=qkv_bias, norm_eps=norm_eps, rope_base=rope_base)
        parts |= dict(rope_scaling=rope_scaling, dtype=dtype, param_dtype=param_dtype)
        super().__init__(d_model, heads=heads, kv_heads=kv_heads, head_dim=head_dim, **parts, rngs=rngs)
        if kv_cache_bits is not None:
            check_quantization(head_dim, kv_cache_bits, default_group(head_dim))
        self.window, self.impl, self.kv_cache_bits = window, impl, kv_cache_bits

    def __call__(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"],
        segment_ids: Int[Array, "B T"] | None = None,
    ) -> Float[Array, "B T D"]:
        """The full causal forward (under a mesh that splits the sequence, the context-parallel op: it gathers K
        and V).

        Args:
            x_BTD: the normalised residual stream [B, T, d_model].
            positions: RoPE positions [T] or [B, T].
            segment_ids: int [B, T]: packed documents; they enter the model here, and only here.

        Returns:
            y: [B, T, d_model].
        """
        q, k, v, _ = project_qkv(self, x_BTD, positions, segment_ids)
        window = self.window
        if context_parallel_size() > 1:
            return self.out(softmax_attention_context_parallel(q, k, v, window=window, segment_ids=segment_ids))
        return self.out(softmax_attention(q, k, v, window=window, segment_ids=segment_ids, impl=self.impl))

    def decode(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"],
        segment_ids: Int[Array, "B T"] | None = None,
        cache: AttentionCache,
    ) -> tuple[Float[Array, "B T D"], AttentionCache]:
        """T tokens written into the cache and attending to what it holds.

        Args:
            x_BTD: the normalised residual stream [B, T, d_model].
            positions: RoPE positions [T] or [B, T].
            segment_ids: int [B, T], or None: each row's document continues.
            cache: the layer's cache to continue (room for T more slots: max_len for A, T <= step_tokens for W).

        Returns:
            y: [B, T, d_model].
            cache: the updated cache.
        """
        return self._step(x_BTD, positions, segment_ids, cache, per_token=False)

    def verify(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"],
        segment_ids: Int[Array, "B T"] | None = None,
        cache: AttentionCache,
    ) -> tuple[Float[Array, "B T D"], AttentionCache]:
        """A decode step that keeps what a rollback needs.

        Args:
            x_BTD: the normalised residual stream [B, T, d_model].
            positions: RoPE positions [T] or [B, T].
            segment_ids: int [B, T], or None.
            cache: the layer's cache before the T tokens.

        Returns:
            y: [B, T, d_model], as `decode`'s.
            verified: the keys and values after all T tokens and the conv caches after each, [T, ...].
        """
        return self._step(x_BTD, positions, segment_ids, cache, per_token=True)

    def _step(self, x_BTD, positions, segment_ids, cache: AttentionCache, *, per_token: bool):
        """`decode` (per_token False) or `verify` (True: the conv caches per token)."""
        q, k, v, conv_cache = project_qkv(self, x_BTD, positions, segment_ids, cache.conv, conv_per_token=per_token)
        if isinstance(cache.kv, QuantizedKVCache):
            _check_one_document(segment_ids)
            y, kv = softmax_attention_step_quantized(cache.kv, q, k, v, window=self.window)
        else:
            y, kv = softmax_attention_step(cache.kv, q, k, v, window=self.window, segment_ids=segment_ids)
        return self.out(y), AttentionCache(kv, conv_cache)

    def rollback(self, before: AttentionCache, verified: AttentionCache, kept) -> AttentionCache:
        """The cache after the first `kept` tokens of a verify step.

        Args:
            before: the cache the verify step started from.
            verified: what the verify step returned beside y.
            kept (int | Array): the tokens to keep.

        Returns:
            The keys and values cut back (`keep_first`: the slots of the dropped tokens hold `before`'s again, a ring
                buffer's overwritten keys included) and the conv cache of that token.
        """
        return AttentionCache(keep_first(before.kv, verified.kv, kept), select_kept(before.conv, verified.conv, kept))

    def prefill(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"],
        segment_ids: Int[Array, "B T"] | None = None,
        cache: AttentionCache,
    ) -> tuple[Float[Array, "B T D"], AttentionCache]:
        """A whole prompt at stream positions 0..T-1 into an empty cache: the full-sequence op for y, then the last
        min(T, slots) keys, values and segment ids written at slots position % slots.

        Args:
            x_BTD: the prompt's normalised residual stream [B, T, d_model].
            positions: RoPE positions [T] or [B, T].
            segment_ids: int [B, T], or None.
            cache: an empty cache (`init_cache`); a full cache must hold all T.

        Returns:
            y: [B, T, d_model].
            cache: the filled cache.
        """
        T = x_BTD.shape[1]
        kv = cache.kv
        L = kv.k.shape[2]  # k is [B, H, L, d]
        if self.window is None and L < T:
            raise ValueError(f"a full-attention cache needs max_len >= the prompt length {T}, got max_len={L}")
        q, k, v, conv_cache = project_qkv(self, x_BTD, positions, segment_ids, cache.conv)
        y = softmax_attention(q, k, v, window=self.window, segment_ids=segment_ids, impl=self.impl)
        if isinstance(kv, QuantizedKVCache):
            _check_one_document(segment_ids)
            return self.out(y), AttentionCache(fill_quantized_kv_cache(kv, k, v), conv_cache)
        return self.out(y), AttentionCache(fill_kv_cache(kv, k, v, segment_ids), conv_cache)

    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32, *, step_tokens: int = 1) -> AttentionCache:
        """An empty KV cache, quantized with kv_cache_bits, and the conv cache.

        Args:
            batch: rows B.
            max_len: the slots of full attention.
            dtype (DTypeLike): the float cache's dtype.
            step_tokens: a sliding window's ring buffer holds window + step_tokens - 1 slots: enough for decode steps of
                up to step_tokens tokens, at any length.

        Returns:
            The cache.
        """
        check_int("max_len", max_len)
        check_int("step_tokens", step_tokens)
        slots = max_len if self.window is None else self.window + step_tokens - 1
        if self.kv_cache_bits is not None:
            group = default_group(self.head_dim)
            kv = init_quantized_kv_cache(batch, self.kv_heads, self.head_dim, slots, self.kv_cache_bits, group)
        else:
            kv = init_kv_cache(batch, self.kv_heads, self.head_dim, slots, dtype)
        return AttentionCache(kv, None if self.conv is None else self.conv.init_cache(batch, dtype))


def _builder(windowed: bool):
    def build(config, *, rngs: nnx.Rngs) -> Attention:
        window = config.window if windowed else None
        return Attention(
            config.d_model,
            window=window,
            impl=config.attention_impl,
            kv_cache_bits=config.kv_cache_bits,
            **mixer_options(config),
            rngs=rngs,
        )

    return build


def _params(config) -> int:
    return qkvo_weights(config) + qkv_part_params(config)


def _mixing_flops(windowed: bool):
    def flops(config, T: int) -> float:
        """2*T*d per query head for causal softmax (averaged over positions), 2*min(window, T)*d for a window,
        and 2 per convolution tap."""
        keys = min(config.window, T) if windowed else T
        return 2 * keys * config.head_dim * config.n_heads + 2 * conv_taps(config)

    return flops


def _cache_bytes(windowed: bool):
    def cache_bytes(config, batch: int, max_len: int, step_tokens: int = 1) -> int:
        """Keys and values of every slot (float in the compute dtype, or the packed quantized values and their
        bfloat16 scales), each slot's position, each row's slot segment ids (float cache), the length, and the
        conv cache."""
        slots = config.window + step_tokens - 1 if windowed else max_len
        H, d = config.n_kv_heads, config.head_dim
        if config.kv_cache_bits is None:
            kv = 2 * batch * H * slots * d * jnp.dtype(config.dtype).itemsize + 4 * batch * slots
        else:
            values = d * config.kv_cache_bits // 8
            kv = 2 * batch * H * slots * (values + 2 * (d // default_group(d)))
        return kv + 4 * slots + 4 + conv_cache_bytes(config, batch)

    return cache_bytes


FULL_ATTENTION = MixerKind(
    "full attention",
    _builder(False),
    _params,
    qkvo_weights,
    _mixing_flops(False),
    _cache_bytes(False),
    fixed_state=False,
    step_bounded=False,
    recipe=("rope_base",),
)
SLIDING_WINDOW = MixerKind(
    "sliding-window attention",
    _builder(True),
    _params,
    qkvo_weights,
    _mixing_flops(True),
    _cache_bytes(True),
    fixed_state=True,
    step_bounded=True,
    recipe=("rope_base",),
)
