"""The Gated DeltaNet mixer (layer letter D; Yang, Kautz and Hatamizadeh 2024) and its registry entry.

As the paper builds it: q, k, v projections, the optional short convolution (`conv_size`) on each, SiLU, q and k
L2-normalised per head; beta = sigmoid(x W_beta) and the Mamba2-style decay log_g = -exp(A_log) softplus(x W_a +
dt_bias) per kv-head; the gated delta rule (`retention.ops.gated_delta_rule`); a per-head RMSNorm of the output
gated by SiLU(x W_gate); the output projection. No RoPE (the recurrence orders the tokens).

The `Mixer` methods (mixer_interface.py; `MatrixStateMixer` over `_mix`): `__call__(x, *, positions,
segment_ids=None) -> y` is the full forward (the chunked op); `decode(x, *, ..., cache) -> (y, cache)` continues the
sequence the cache holds through the step op, `prefill` is the same into an empty cache, and `verify` keeps the
caches after each token. Its cache (MatrixStateCache): the state S [B, H, d, d] float32, the same size at any
length, each row's last segment id, and the conv cache.
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from retention.nn.mamba2 import init_decay
from retention.nn.matrix_state import (
    MatrixStateCache,
    MatrixStateMixer,
    matrix_cache_bytes,
    run_mixing,
)
from retention.nn.mixer_kind import MixerKind
from retention.nn.qkv import (
    QKVMixer,
    conv_taps,
    head_gate_proj,
    mixer_options,
    project_qkv,
    qkv_part_params,
    qkvo_weights,
)
from retention.ops import (
    check_chunk_size,
    gated_delta_rule,
    gated_delta_rule_context_parallel,
    gated_delta_rule_step,
)
from retention.ops.chunking import default_chunk_size
from retention.ops.gated_delta_rule.op import PREFERRED_CHUNK
from retention.parallel.rules import logical_param

NORM_EPS = 1e-6  # the output RMSNorm's epsilon (fixed: norm_eps is the blocks' and QK-norm's)


def _l2_normalise(x: Float[Array, "... d"]) -> Float[Array, "... d"]:
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


class GatedDeltaNet(MatrixStateMixer, QKVMixer):
    """The Gated DeltaNet mixer (module docstring), on `gated_delta_rule`.

    Args:
        d_model: the model width.
        heads: query heads; query head i reads kv-head i // (heads // kv_heads).
        kv_heads: key/value heads H.
        head_dim: d_k = d_v.
        qk_norm: RMSNorm of q and k before the L2 normalisation.
        conv_size: taps of the short convolution; 0: none.
        qkv_bias: biases on the q, k and v projections.
        norm_eps: the RMSNorms' epsilon.
        decay_init: the decay's start (mamba2.A_RANGES): "paper", Mamba2's, or "long", 64 times slower.
        chunk_size: the op's chunk size; None: its default.
        dtype (DTypeLike): the compute dtype; the state is float32.
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
        qk_norm: bool = False,
        conv_size: int = 0,
        qkv_bias: bool = False,
        norm_eps: float = 1e-6,
        decay_init: str = "paper",
        chunk_size: int | None = None,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        check_chunk_size(chunk_size)
        parts = dict(qk_norm=qk_norm, conv_size=conv_size, qkv_bias=qkv_bias, norm_eps=norm_eps, rope_base=None)
        parts |= dict(dtype=dtype, param_dtype=param_dtype)
        super().__init__(d_model, heads=heads, kv_heads=kv_heads, head_dim=head_dim, **parts, rngs=rngs)
        self.chunk_size = chunk_size
        self.gate_proj = head_gate_proj(d_model, heads, head_dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        kv_names = logical_param("embed", "kv_heads")
        f32_linear = lambda: nnx.Linear(
            d_model, kv_heads, use_bias=False, param_dtype=param_dtype, kernel_metadata=kv_names, rngs=rngs
        )
        self.beta_proj, self.a_proj = f32_linear(), f32_linear()
        self.dt_bias, self.A_log = init_decay(rngs, kv_heads, param_dtype, "kv_heads", decay_init)  # Mamba2's
        self.o_norm = nnx.RMSNorm(
            head_dim,
            epsilon=NORM_EPS,
            dtype=jnp.float32,
            param_dtype=param_dtype,
            scale_metadata=logical_param("head_dim"),
            rngs=rngs,
        )

    def _mix(
        self,
        x_BTD: Float[Array, "B T D"],
        positions: Int[Array, "*b T"] | None,
        segment_ids: Int[Array, "B T"] | None,
        cache: MatrixStateCache | None,
        *,
        per_token: bool,
    ) -> tuple[Float[Array, "B T D"], MatrixStateCache | None]:
        """The body of every mode (`MatrixStateMixer`): the full forward (cache None) or T tokens continuing the
        cache (rows whose first token starts a new document begin from an empty state).

        Args:
            x_BTD: the normalised residual stream [B, T, d_model].
            positions: RoPE positions, as in the other mixers.
            segment_ids: int [B, T], or None.
            cache: the layer's cache to continue; None: a full forward.
            per_token: a verify step: return the caches after each token.

        Returns:
            y: [B, T, d_model].
            cache: the new cache or None; with `per_token` the caches after each token stacked [T, ...]
                (`matrix_state.run_mixing`).
        """
        B, T, _ = x_BTD.shape
        conv = None if cache is None else cache.conv
        q, k, v, conv_cache = project_qkv(self, x_BTD, positions, segment_ids, conv, conv_per_token=per_token)
        q, k, v = _l2_normalise(jax.nn.silu(q)), _l2_normalise(jax.nn.silu(k)), jax.nn.silu(v)
        x32 = x_BTD.astype(jnp.float32)
        beta = jax.nn.sigmoid(self.beta_proj(x32))
        log_g = -jnp.exp(self.A_log[...]) * jax.nn.softplus(self.a_proj(x32) + self.dt_bias[...])
        o, cache = run_mixing(
            gated_delta_rule,
            gated_delta_rule_context_parallel,
            gated_delta_rule_step,
            (q, k, v, beta, log_g),
            cache=cache,
            conv_cache=conv_cache,
            segment_ids=segment_ids,
            chunk_size=self.chunk_size,
            per_token=per_token,
        )
        gate = jax.nn.silu(self.gate_proj(x_BTD)).reshape(B, T, self.heads, self.head_dim)
        o = (self.o_norm(o.astype(jnp.float32)) * gate.astype(jnp.float32)).astype(x_BTD.dtype)
        return self.out(o), cache

    @property
    def state_dims(self) -> tuple[int, int, int]:
        """The state's (heads, d_k, d_v)."""
        return (self.kv_heads, self.head_dim, self.head_dim)


def _build(config, *, rngs: nnx.Rngs) -> GatedDeltaNet:
    return GatedDeltaNet(
        config.d_model,
        decay_init=config.decay_init,
        chunk_size=config.chunk_size,
        **mixer_options(config, rope=False),
        rngs=rngs,
    )


def _matmul_params(config) -> int:
    """q, k, v, o; beta and the decay's step (one per kv-head); the output gate (one per query channel)."""
    D = config.d_model
    return qkvo_weights(config) + 2 * D * config.n_kv_heads + D * config.n_heads * config.head_dim


def _params(config) -> int:
    """The matmul weights, the conv and QK-norm parts, A_log and dt_bias per kv-head, the output norm's scale."""
    return _matmul_params(config) + qkv_part_params(config) + 2 * config.n_kv_heads + config.head_dim


def _mixing_flops(config, T: int) -> float:
    """Per token: the state write 2 d^2 per kv head and its correction W S another 2 d^2, the read 2 d^2 per query
    head; inside the chunk 2 c d for the keys' Gram matrix and the triangular solve per kv head, 4 c d per query head
    (scores and their product with U); 2 per convolution tap."""
    Hq, H, d = config.n_heads, config.n_kv_heads, config.head_dim
    c = config.chunk_size or default_chunk_size(T, PREFERRED_CHUNK)
    return 4 * d * d * H + 2 * d * d * Hq + 2 * c * d * H + 4 * c * d * Hq + 2 * conv_taps(config)


GATED_DELTANET = MixerKind(
    "Gated DeltaNet",
    _build,
    _params,
    _matmul_params,
    _mixing_flops,
    matrix_cache_bytes,
    fixed_state=True,
    step_bounded=False,
    recipe=("decay_init",),
)
