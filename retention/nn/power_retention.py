"""The power-retention mixer (layer letter P) and its registry entry.

The `Mixer` methods (mixer_interface.py; positions: RoPE's, needed only with a rope_base; the recipe has none):
`__call__(x, *, positions=None, segment_ids=None) -> y` is one full-sequence forward (the context-parallel op under
a mesh whose "sequence" axis splits the tokens); `decode(x, *, ..., cache) -> (y, cache)` continues the sequence the
cache holds, as one call of the step op (`power_retention_step`: one chunk against the state up to the chunk size,
the chunked op from the state beyond); `prefill` is the same into an empty cache; `verify` keeps the caches after
each token.
Its cache is a RetentionCache: the RetentionState (S [B, H, D, d], z [B, H, D], float32, the same size at any
length), each row's last segment id and, with `conv_size`, the short convolution's last conv_size - 1 inputs and
their segment ids. With a cache, segment_ids None continues each row's document; a step whose first token has an
id other than the row's last one clears that row's state.
"""

from typing import NamedTuple

import jax
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
    per_token_segment_ids,
    project_qkv,
    qkv_part_params,
    qkvo_weights,
)
from retention.nn.rope import RopeScaling
from retention.ops import (
    RETENTION_IMPLS,
    RetentionState,
    check_chunk_size,
    check_deg,
    context_parallel_size,
    init_state,
    power_retention,
    power_retention_context_parallel,
    power_retention_step,
    sympow_dim,
)
from retention.ops.chunking import default_chunk_size
from retention.ops.power_retention.recurrent import chunk_states
from retention.ops.power_retention.state import clear_rows
from retention.parallel.rules import logical_param
from retention.validation import check_choice, check_int, check_number

GATE_BIAS_INIT = 4.0  # gates start near sigmoid(4) = 0.98: a slow decay that training can sharpen


class RetentionCache(NamedTuple):
    """A power-retention layer's decode cache.

    Attributes:
        state: S [B, H, D, d] and z [B, H, D], float32.
        segment_id: each row's last segment id [B], to see a new document coming.
        conv: the last conv_size - 1 inputs of q, k and v; None without a convolution.
    """

    state: RetentionState
    segment_id: Int[Array, " B"]
    conv: QKVConvCache | None


class PowerRetention(QKVMixer):
    """Power retention mixer: q, k, v projections (GQA), a causal short convolution on each, QK RMSNorm, optional
    RoPE, an optional per-kv-head gate log_g = log_sigmoid(x W_g + b_g), the power retention op, and the output
    projection.

    The defaults are the recipe (docs/DESIGN.md section 3): 4 taps, QK-norm, no RoPE, the gate.

    Args:
        d_model: the model width.
        heads: query heads Hq.
        kv_heads: key/value heads H, dividing Hq.
        head_dim: d.
        deg: the even degree p.
        gating: learn the gate; False: no decay.
        gate_bias_init: b_g's initial value (4.0: the gate starts at sigmoid(4) = 0.98, a slow decay).
        qk_norm: RMSNorm over the head dim of q and k.
        conv_size: taps of the short convolution on q, k and v; 0: none.
        qkv_bias: biases on the q, k and v projections.
        norm_eps: the RMSNorms' epsilon.
        rope_scaling: RoPE's frequency scaling, or None.
        rope_base: RoPE's base; None (the recipe): no RoPE.
        chunk_size: the op's chunk size; None: its default.
        impl: the op's (one of RETENTION_IMPLS), passed through: "reference" has no state, so it serves the full
            forward only.
        dtype (DTypeLike): the compute dtype; the state is float32 whatever it is.
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
        deg: int = 2,
        gating: bool = True,
        gate_bias_init: float = GATE_BIAS_INIT,
        qk_norm: bool = True,
        conv_size: int = 4,
        qkv_bias: bool = False,
        norm_eps: float = 1e-6,
        rope_scaling: RopeScaling | None = None,
        rope_base: float | None = None,
        chunk_size: int | None = None,
        impl: str = "auto",
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        check_deg(deg)
        check_number("gate_bias_init", gate_bias_init)
        check_chunk_size(chunk_size)
        check_choice("impl", impl, RETENTION_IMPLS)
        parts = dict(qk_norm=qk_norm, conv_size=conv_size, qkv_bias=qkv_bias, norm_eps=norm_eps, rope_base=rope_base)
        parts |= dict(rope_scaling=rope_scaling, dtype=dtype, param_dtype=param_dtype)
        super().__init__(d_model, heads=heads, kv_heads=kv_heads, head_dim=head_dim, **parts, rngs=rngs)
        self.deg, self.chunk_size, self.impl = deg, chunk_size, impl
        self.gate_proj = (
            nnx.Linear(
                d_model,
                kv_heads,
                bias_init=nnx.initializers.constant(gate_bias_init),
                kernel_metadata=logical_param("embed", "kv_heads"),
                bias_metadata=logical_param("kv_heads"),
                dtype=jnp.float32,
                param_dtype=param_dtype,
                rngs=rngs,
            )
            if gating
            else None
        )

    def __call__(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"] | None = None,
        segment_ids: Int[Array, "B T"] | None = None,
    ) -> Float[Array, "B T D"]:
        """The full forward: the op, or its context-parallel form under a mesh that splits the sequence.

        Args:
            x_BTD: the normalised residual stream [B, T, d_model].
            positions: RoPE positions [T] or [B, T]; unused without RoPE.
            segment_ids: int [B, T]: packed documents; they enter the model here, and only here.

        Returns:
            y: [B, T, d_model].
        """
        q, k, v, _ = project_qkv(self, x_BTD, positions, segment_ids)
        log_g = self._log_g(x_BTD)
        options = dict(segment_ids=segment_ids, deg=self.deg, chunk_size=self.chunk_size, impl=self.impl)
        if context_parallel_size() > 1:
            y = power_retention_context_parallel(q, k, v, log_g, **options)
        else:
            y = power_retention(q, k, v, log_g, **options)
        return self.out(y)

    def prefill(self, x_BTD, *, positions=None, segment_ids=None, cache: RetentionCache):
        """A prompt into a fresh cache: the same as `decode` from it (the step op: one chunk against the state up to
        the chunk size, the chunked op from the state beyond).

        Args:
            x_BTD (Array): the prompt's normalised residual stream [B, T, d_model].
            positions (Array | None): RoPE positions [T] or [B, T].
            segment_ids (Array | None): int [B, T], or None.
            cache: an empty cache (`init_cache`).

        Returns:
            (tuple[Array, RetentionCache]): y [B, T, d_model] and the filled cache.
        """
        return self.decode(x_BTD, positions=positions, segment_ids=segment_ids, cache=cache)

    def decode(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"] | None = None,
        segment_ids: Int[Array, "B T"] | None = None,
        cache: RetentionCache,
    ) -> tuple[Float[Array, "B T D"], RetentionCache]:
        """T tokens continuing the cache, as one call of the step op; rows whose first token starts a new document
        begin from an empty state.

        Args:
            x_BTD: the normalised residual stream [B, T, d_model].
            positions: RoPE positions [T] or [B, T]; unused without RoPE.
            segment_ids: int [B, T], or None: each row's document continues.
            cache: the layer's cache to continue.

        Returns:
            y: [B, T, d_model].
            cache: the new cache.
        """
        return self._step(x_BTD, positions, segment_ids, cache, per_token=False)

    def verify(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"] | None = None,
        segment_ids: Int[Array, "B T"] | None = None,
        cache: RetentionCache,
    ) -> tuple[Float[Array, "B T D"], RetentionCache]:
        """A decode step that returns the caches after each token, every field stacked [T, ...]: the states from the
        one chunk (`chunk_states`, T D (d + 1) float32 per kv-head) and the conv caches per token.

        Args:
            x_BTD: the normalised residual stream [B, T, d_model].
            positions: RoPE positions [T] or [B, T]; unused without RoPE.
            segment_ids: int [B, T], or None.
            cache: the layer's cache before the T tokens.

        Returns:
            y: [B, T, d_model], as `decode`'s.
            per_token: the caches after each token (for `rollback`).
        """
        return self._step(x_BTD, positions, segment_ids, cache, per_token=True)

    def _log_g(self, x_BTD):
        return None if self.gate_proj is None else jax.nn.log_sigmoid(self.gate_proj(x_BTD))

    def _step(self, x_BTD, positions, segment_ids, cache: RetentionCache, *, per_token: bool):
        """`decode` (per_token False) or `verify` (True)."""
        T = x_BTD.shape[1]
        q, k, v, conv_cache = project_qkv(self, x_BTD, positions, segment_ids, cache.conv, conv_per_token=per_token)
        log_g = self._log_g(x_BTD)
        deg, chunk_size, impl = self.deg, self.chunk_size, self.impl
        state, last_id = cache.state, cache.segment_id
        if segment_ids is not None:
            state = clear_rows(state, segment_ids[:, 0] != last_id)
            last_id = segment_ids[:, -1].astype(jnp.int32)
        step_ids = segment_ids if T > 1 else None  # one token holds no document start
        y, new_state = power_retention_step(
            state, q, k, v, log_g, segment_ids=step_ids, deg=deg, chunk_size=chunk_size, impl=impl
        )
        if per_token:
            states = chunk_states(state, k, v, log_g, segment_ids=step_ids, deg=deg)
            return self.out(y), RetentionCache(states, per_token_segment_ids(last_id, segment_ids, T), conv_cache)
        return self.out(y), RetentionCache(new_state, last_id, conv_cache)

    def init_cache(self, batch: int, max_len: int, dtype=None, *, step_tokens: int = 1) -> RetentionCache:
        """An empty cache; its size does not depend on max_len or step_tokens (taken for the common mixer interface).

        Args:
            batch: rows B.
            max_len: the longest sequence (unused: the state does not grow).
            dtype (DTypeLike | None): the conv cache's dtype; None: float32.
            step_tokens: the most tokens a decode step feeds (unused).

        Returns:
            The state S [batch, H, D, d] and z [batch, H, D] in float32, last segment ids 0 [batch], and the conv cache.
        """
        check_int("batch", batch)
        check_int("max_len", max_len)
        state = init_state(batch, self.kv_heads, self.head_dim, self.deg)
        conv = None if self.conv is None else self.conv.init_cache(batch, jnp.float32 if dtype is None else dtype)
        return RetentionCache(state, jnp.zeros((batch,), jnp.int32), conv)


def _build(config, *, rngs: nnx.Rngs) -> PowerRetention:
    return PowerRetention(
        config.d_model,
        deg=config.deg,
        gating=config.gating,
        gate_bias_init=config.gate_bias_init,
        chunk_size=config.chunk_size,
        impl=config.retention_impl,
        **mixer_options(config),
        rngs=rngs,
    )


def _matmul_params(config) -> int:
    return qkvo_weights(config) + (config.d_model * config.n_kv_heads if config.gating else 0)


def _params(config) -> int:
    return _matmul_params(config) + qkv_part_params(config) + (config.n_kv_heads if config.gating else 0)


def _mixing_flops(config, T: int) -> float:
    """2*D*d per kv head (the state write) and per query head (the read), 2*c*d per query head inside the chunk
    (DESIGN section 1), and 2 per convolution tap."""
    Hq, H, d = config.n_heads, config.n_kv_heads, config.head_dim
    c = config.chunk_size or default_chunk_size(T)
    return 2 * sympow_dim(d, config.deg) * d * (H + Hq) + 2 * c * d * Hq + 2 * conv_taps(config)


def _cache_bytes(config, batch: int, max_len: int, step_tokens: int = 1) -> int:
    """S and z in float32 (4 * D * (d + 1) per kv head), each row's last segment id, the conv cache."""
    state = 4 * config.n_kv_heads * sympow_dim(config.head_dim, config.deg) * (config.head_dim + 1)
    return batch * (state + 4) + conv_cache_bytes(config, batch)


POWER_RETENTION = MixerKind(
    "power retention",
    _build,
    _params,
    _matmul_params,
    _mixing_flops,
    _cache_bytes,
    fixed_state=True,
    step_bounded=False,
    recipe=("rope_base", "deg"),
)
