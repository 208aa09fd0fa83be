"""What every q/k/v mixer shares: the optional parts between the projections and the op (the short convolution
and QK RMSNorm), the projections themselves with RoPE, and their sizes for the mixer registry's formulas; and the
constructor arguments every mixer (Mamba2 too) takes alike from an LMConfig (`mixer_options`)."""

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name
from jaxtyping import Array, Float, Int

from retention.nn.conv import QKVConv, check_conv_size
from retention.nn.layers import QKNorm, apply_rope, check_heads, check_rope_base
from retention.nn.rope import RopeScaling
from retention.parallel.rules import BTHD, BTKD, constrain, logical_param
from retention.validation import check_int, check_number


def mixer_options(config, *, qkv: bool = True, rope: bool = True) -> dict:
    """The constructor arguments the mixers take alike from an LMConfig: each mixer's `build` passes these and
    names only its own beside them.

    Args:
        config (LMConfig): the config of the layer's letter (`config.for_kind`).
        qkv: with the q/k/v mixers' heads and parts (heads, kv_heads, qk_norm, qkv_bias, norm_eps); False for
            Mamba2, whose heads follow from its expansion.
        rope: with RoPE's (rope_base, rope_scaling); False for the mixers without RoPE (Gated DeltaNet, GLA,
            Mamba2).

    Returns:
        (dict): head_dim, conv_size, dtype and param_dtype, and the groups asked for.
    """
    arguments = dict(
        head_dim=config.head_dim,
        conv_size=config.conv_size,
        dtype=jnp.dtype(config.dtype),
        param_dtype=jnp.dtype(config.param_dtype),
    )
    if qkv:
        arguments |= dict(
            heads=config.n_heads,
            kv_heads=config.n_kv_heads,
            qk_norm=config.qk_norm,
            qkv_bias=config.qkv_bias,
            norm_eps=config.norm_eps,
        )
    if rope:
        arguments |= dict(rope_base=config.rope_base, rope_scaling=config.rope_frequency_scaling)
    return arguments


def qkvo_weights(config) -> int:
    """Weights of the q, k, v and output projections (GQA: k and v have n_kv_heads heads)."""
    D, Hq, H, d = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim
    return 2 * D * Hq * d + 2 * D * H * d


def conv_taps(config) -> int:
    """Kernel weights of one mixer's short convolutions: conv_size per channel of q, k and v."""
    return config.conv_size * (config.n_heads + 2 * config.n_kv_heads) * config.head_dim


def qkv_part_params(config) -> int:
    """Parameters of the optional parts: the convolution taps, QK-norm's two scales of head_dim and the q, k and
    v projections' biases."""
    biases = (config.n_heads + 2 * config.n_kv_heads) * config.head_dim if config.qkv_bias else 0
    return conv_taps(config) + (2 * config.head_dim if config.qk_norm else 0) + biases


def conv_cache_bytes(config, batch: int, channels: int | None = None) -> int:
    """Bytes of the conv cache (QKVConvCache): the last conv_size - 1 inputs of the convolved channels (None: q, k
    and v's) in the compute dtype and their int32 segment ids, per row; 0 without a convolution."""
    if not config.conv_size:
        return 0
    if channels is None:
        channels = (config.n_heads + 2 * config.n_kv_heads) * config.head_dim
    return batch * (config.conv_size - 1) * (channels * jnp.dtype(config.dtype).itemsize + 4)


def head_gate_proj(d_model: int, heads: int, head_dim: int, *, dtype, param_dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """The output gate's projection [B, T, D] -> [B, T, heads * head_dim], no bias, kernel ("embed", "heads")."""
    return nnx.Linear(
        d_model,
        heads * head_dim,
        use_bias=False,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_metadata=logical_param("embed", "heads"),
        rngs=rngs,
    )


def make_qkv_parts(heads, kv_heads, head_dim, conv_size, qk_norm, *, norm_eps=1e-6, dtype, param_dtype, rngs):
    """The optional pieces between the projections and the op: (QKVConv or None, QKNorm or None, of epsilon
    norm_eps)."""
    check_conv_size("conv_size", conv_size)
    conv = (
        QKVConv(
            heads * head_dim, kv_heads * head_dim, conv_size, ("heads", "kv_heads"), param_dtype=param_dtype, rngs=rngs
        )
        if conv_size
        else None
    )
    norm = QKNorm(head_dim, epsilon=norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs) if qk_norm else None
    return conv, norm


class QKVMixer(nnx.Module):
    """The base of every q/k/v mixer: q, k, v projections (GQA: k and v have kv_heads heads), the output projection,
    the optional parts (a causal short convolution of conv_size taps, 0: none; QK RMSNorm of epsilon norm_eps; biases
    on the q, k and v projections with qkv_bias, as Qwen2's) and RoPE (rope_base None: none; its frequencies rescaled
    by rope_scaling, rope.py). A subclass adds its own parameters and its op, calls `project_qkv(self, ...)` and
    `self.out(y)`."""

    def __init__(
        self,
        d_model: int,
        *,
        heads: int,
        kv_heads: int,
        head_dim: int,
        qk_norm: bool,
        conv_size: int,
        rope_base: float | None,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
        qkv_bias: bool = False,
        norm_eps: float = 1e-6,
        rope_scaling: RopeScaling | None = None,
    ):
        check_int("d_model", d_model)
        check_heads(heads, kv_heads, head_dim)
        check_rope_base(rope_base, head_dim)
        check_number("norm_eps", norm_eps, low=0, open_low=True)
        if rope_scaling is not None and rope_base is None:
            raise ValueError(f"rope_scaling needs RoPE (a rope_base), got rope_scaling={rope_scaling} and no rope_base")
        self.heads, self.kv_heads, self.head_dim, self.rope_base = heads, kv_heads, head_dim, rope_base
        self.rope_scaling = rope_scaling
        options = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)  # every part's: the projections, conv, norm
        linear = lambda i, o, *names, bias=False: nnx.Linear(
            i,
            o,
            use_bias=bias,
            kernel_metadata=logical_param("embed", *names),
            bias_metadata=logical_param(*names),
            **options,
        )
        self.q_proj = linear(d_model, heads * head_dim, "heads", bias=qkv_bias)
        self.k_proj = linear(d_model, kv_heads * head_dim, "kv_heads", bias=qkv_bias)
        self.v_proj = linear(d_model, kv_heads * head_dim, "kv_heads", bias=qkv_bias)
        self.o_proj = nnx.Linear(
            heads * head_dim, d_model, use_bias=False, kernel_metadata=logical_param("heads", "embed"), **options
        )
        self.conv, self.qk_norm = make_qkv_parts(
            heads, kv_heads, head_dim, conv_size, qk_norm, norm_eps=norm_eps, **options
        )

    def rollback(self, before, verified, kept: Int[Array, ""]):
        """The cache after the first `kept` (0..T) tokens of a verify step from the cache `before`, given what the
        step returned (`verify`: every cache field stacked per token, [T, ...]); see `select_kept`."""
        return select_kept(before, verified, kept)

    def out(self, y_BTHd: Float[Array, "B T Hq d"]) -> Float[Array, "B T D"]:
        """The output projection of the op's heads (named "o_proj" for the remat policies, remat.py)."""
        B, T = y_BTHd.shape[:2]
        y_BTHd = constrain(y_BTHd, BTHD)
        return checkpoint_name(self.o_proj(y_BTHd.reshape(B, T, self.heads * self.head_dim)), "o_proj")


def project_qkv(mixer, x_BTD, positions, segment_ids, conv_cache=None, *, conv_per_token: bool = False):
    """q [B, T, Hq, d], k and v [B, T, H, d] of either mixer: projections, the short convolution (continuing
    `conv_cache` when given, a decode step's or a prefill's; within each document of segment_ids [B, T] or None),
    QK RMSNorm and RoPE as configured (positions may be None without RoPE); and the new conv cache (None without
    one, or without a convolution), or with `conv_per_token` (a verify step) the conv caches after each token
    stacked [T, ...] (`QKVConv.per_token_caches`). The projections' outputs are named "q_proj", "k_proj" and
    "v_proj" for the remat policies (remat.py)."""
    B, T, _ = x_BTD.shape
    q, k, v = (checkpoint_name(getattr(mixer, n)(x_BTD), n) for n in ("q_proj", "k_proj", "v_proj"))
    conv_per_token_caches = None
    if mixer.conv is not None and conv_per_token:
        conv_per_token_caches = mixer.conv.per_token_caches(q, k, v, segment_ids_BT=segment_ids, cache=conv_cache)
    if mixer.conv is not None:
        q, k, v, conv_cache = mixer.conv(q, k, v, segment_ids_BT=segment_ids, cache=conv_cache)
    q = constrain(q.reshape(B, T, mixer.heads, mixer.head_dim), BTHD)
    k = constrain(k.reshape(B, T, mixer.kv_heads, mixer.head_dim), BTKD)
    v = constrain(v.reshape(B, T, mixer.kv_heads, mixer.head_dim), BTKD)
    if mixer.qk_norm is not None:
        q, k = mixer.qk_norm(q, k)
    if mixer.rope_base is not None:
        if positions is None:
            raise ValueError(
                f"positions (the tokens' RoPE positions [T] or [B, T]) are needed with rope_base={mixer.rope_base}"
            )
        rope = lambda x: apply_rope(x, positions, mixer.rope_base, mixer.rope_scaling)
        q, k = rope(q), rope(k)
    return q, k, v, conv_per_token_caches if conv_per_token else conv_cache


def select_kept(before, per_token, kept: Int[Array, ""]):
    """Entry kept - 1 of every leaf of a per-token stacked cache `per_token` ([T, ...]), or `before` when kept is
    0."""
    index = jnp.maximum(kept - 1, 0)
    pick = lambda b, t: jnp.where(kept == 0, b, jax.lax.dynamic_index_in_dim(t, index, keepdims=False))
    return jax.tree.map(pick, before, per_token)


def per_token_segment_ids(last_id_B: Int[Array, " B"], segment_ids_BT: Int[Array, "B T"] | None, T: int):
    """Each row's last segment id after each of a step's T tokens, [T, B]: the step's ids, or (None) the row's."""
    if segment_ids_BT is None:
        return jnp.broadcast_to(last_id_B, (T,) + last_id_B.shape)
    return segment_ids_BT.T.astype(jnp.int32)
