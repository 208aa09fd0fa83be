"""The gated linear attention mixer (layer letter G; Yang, Wang, Shen, Panda and Kim 2023) and its registry entry.

As the paper builds it: q, k, v projections (the optional short convolution, `conv_size`, on each: the paper has
none, the config may add one); a data-dependent decay per key channel from a low-rank projection,
log_g = log_sigmoid(x W_1 W_2 + b) / GATE_NORMALISER; gated linear attention (`retention.ops.gated_linear_attention`);
a per-head RMSNorm of the output gated by SiLU(x W_gate); the output projection. No RoPE.

The `Mixer` methods (mixer_interface.py) and the cache (MatrixStateCache: S [B, H, d, d] float32, each row's last
segment id, the conv cache) as the Gated DeltaNet mixer's (`matrix_state.py`).
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

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
    gated_linear_attention,
    gated_linear_attention_context_parallel,
    gated_linear_attention_step,
)
from retention.ops.chunking import default_chunk_size
from retention.ops.gated_linear_attention.op import PREFERRED_CHUNK
from retention.parallel.rules import logical_param
from retention.validation import check_choice

GATE_RANK = 16  # the decay's low-rank projection (the paper's)
GATE_NORMALISER = 16.0  # log-gates divided by this: decays start near 1 (the paper's)
GATE_BIASES = {  # the decay logits' initial bias, by `decay_init` (DESIGN section 3, the recipe table)
    "paper": 0.0,  # the paper's: log_sigmoid(0) / 16, a decay of 0.958 per token, 0.13 after 48 tokens
    "long": 4.0,  # log_sigmoid(4) / 16: 0.9989 per token, 0.95 after 48 tokens
}


class GatedLinearAttention(MatrixStateMixer, QKVMixer):
    """The GLA mixer (module docstring), on `gated_linear_attention`.

    Args:
        d_model: the model width.
        heads: query heads; query head i reads kv-head i // (heads // kv_heads).
        kv_heads: key/value heads H.
        head_dim: d_k = d_v.
        qk_norm: RMSNorm over the head dim of q and k.
        conv_size: taps of the short convolution; 0: none.
        qkv_bias: biases on the q, k and v projections.
        norm_eps: the RMSNorms' epsilon.
        decay_init: the decay logits' initial bias (GATE_BIASES): "paper", 0, or "long", 4.
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
        check_choice("decay_init", decay_init, tuple(GATE_BIASES))
        parts = dict(qk_norm=qk_norm, conv_size=conv_size, qkv_bias=qkv_bias, norm_eps=norm_eps, rope_base=None)
        parts |= dict(dtype=dtype, param_dtype=param_dtype)
        super().__init__(d_model, heads=heads, kv_heads=kv_heads, head_dim=head_dim, **parts, rngs=rngs)
        self.chunk_size = chunk_size
        self.gate_proj = head_gate_proj(d_model, heads, head_dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        down_names = logical_param("embed", "gate_rank")
        self.decay_down = nnx.Linear(
            d_model, GATE_RANK, use_bias=False, param_dtype=param_dtype, kernel_metadata=down_names, rngs=rngs
        )
        up_names = dict(kernel_metadata=logical_param("gate_rank", "kv_heads"), bias_metadata=logical_param("kv_heads"))
        bias_init = nnx.initializers.constant(GATE_BIASES[decay_init])
        self.decay_up = nnx.Linear(
            GATE_RANK, kv_heads * head_dim, bias_init=bias_init, param_dtype=param_dtype, **up_names, rngs=rngs
        )
        self.o_norm = nnx.RMSNorm(
            head_dim,
            epsilon=1e-6,
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
        gate_logits = self.decay_up(self.decay_down(x_BTD.astype(jnp.float32)))
        log_g = jax.nn.log_sigmoid(gate_logits).reshape(B, T, self.kv_heads, self.head_dim) / GATE_NORMALISER
        o, cache = run_mixing(
            gated_linear_attention,
            gated_linear_attention_context_parallel,
            gated_linear_attention_step,
            (q, k, v, log_g),
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


def _build(config, *, rngs: nnx.Rngs) -> GatedLinearAttention:
    return GatedLinearAttention(
        config.d_model,
        decay_init=config.decay_init,
        chunk_size=config.chunk_size,
        **mixer_options(config, rope=False),
        rngs=rngs,
    )


def _matmul_params(config) -> int:
    """q, k, v, o; the decay's two low-rank factors; the output gate (one per query channel)."""
    D, H, d = config.d_model, config.n_kv_heads, config.head_dim
    return qkvo_weights(config) + GATE_RANK * (D + H * d) + D * config.n_heads * d


def _params(config) -> int:
    """The matmul weights, the conv and QK-norm parts, the decay's bias (one per key channel), the norm's scale."""
    return _matmul_params(config) + qkv_part_params(config) + config.n_kv_heads * config.head_dim + config.head_dim


def _mixing_flops(config, T: int) -> float:
    """Per token: the state write 2 d^2 per kv head and the read 2 d^2 per query head; inside the chunk 4 c d per
    query head (scores and their product with v); 2 per convolution tap."""
    Hq, H, d = config.n_heads, config.n_kv_heads, config.head_dim
    c = config.chunk_size or default_chunk_size(T, PREFERRED_CHUNK)
    return 2 * d * d * (H + Hq) + 4 * c * d * Hq + 2 * conv_taps(config)


GLA = MixerKind(
    "gated linear attention",
    _build,
    _params,
    _matmul_params,
    _mixing_flops,
    matrix_cache_bytes,
    fixed_state=True,
    step_bounded=False,
    recipe=("decay_init",),
)
