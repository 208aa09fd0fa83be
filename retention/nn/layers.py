"""Small pieces shared by the mixers and the model: argument checks, rotary position embedding and the positions
it reads inside packed documents, QK RMSNorm, the SwiGLU MLP."""

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from retention.nn.rope import RopeScaling, rope_frequencies
from retention.parallel.rules import BTF, constrain, logical_param
from retention.validation import check_int


def check_heads(heads: int, kv_heads: int, head_dim: int, *, names=("heads", "kv_heads", "head_dim")) -> None:
    """Positive head counts and head dim, with the query heads a multiple of the kv heads (GQA)."""
    for name, value in zip(names, (heads, kv_heads, head_dim)):
        check_int(name, value)
    if heads % kv_heads:
        raise ValueError(
            f"{names[0]} must be a multiple of {names[1]} (GQA), got {names[0]}={heads} and {names[1]}={kv_heads}"
        )


def check_rope_base(rope_base, head_dim: int, *, names=("rope_base", "head_dim")) -> None:
    """rope_base is None (no RoPE) or a number > 1, and RoPE needs an even head dim."""
    if rope_base is None:
        return
    if isinstance(rope_base, bool) or not isinstance(rope_base, (int, float)) or not rope_base > 1:
        raise ValueError(f"{names[0]} must be None (no RoPE) or a number > 1, got {rope_base!r}")
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even {names[1]}, got {names[1]}={head_dim} (or set {names[0]}=None)")


def apply_rope(
    x_BTHd: Float[Array, "B T H d"], positions: Int[Array, "*b T"], base: float, scaling: RopeScaling | None = None
) -> Float[Array, "B T H d"]:
    """Rotary position embedding (GPT-NeoX layout, Hugging Face Llama's rotate_half): rotates each pair
    (x_i, x_{i+d/2}) by the angle position * base^(-2i/d), the frequencies rescaled by `scaling` (rope.py).
    `positions` is [T] (shared by the batch) or [B, T]; computed in float32."""
    d = x_BTHd.shape[-1]
    half = d // 2
    inv_freq = rope_frequencies(d, base, scaling)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [*b, T, d/2]
    cos, sin = jnp.cos(angles)[..., None, :], jnp.sin(angles)[..., None, :]  # broadcast over heads
    x1 = x_BTHd[..., :half].astype(jnp.float32)
    x2 = x_BTHd[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_BTHd.dtype)


def document_positions(
    segment_ids_BT: Int[Array, "B T"],
    previous_segment_B: Int[Array, " B"] | None = None,
    next_position_B: Int[Array, " B"] | None = None,
) -> Int[Array, "B T"]:
    """Each token's position inside its document (documents: runs of equal segment ids): 0 at a document start,
    then 1, 2, ... The first tokens continue the previous call's document when their id equals
    previous_segment_B, from next_position_B (a decode step); None: the call starts with a document at 0."""
    B, T = segment_ids_BT.shape
    previous = segment_ids_BT[:, 0] if previous_segment_B is None else previous_segment_B
    offset = jnp.zeros((B,), jnp.int32) if next_position_B is None else next_position_B
    t = jnp.arange(T, dtype=jnp.int32)
    starts = segment_ids_BT != jnp.concatenate([previous[:, None], segment_ids_BT[:, :-1]], axis=1)
    last_start = jax.lax.cummax(jnp.where(starts, t, -1), axis=1)
    return jnp.where(last_start >= 0, t - last_start, offset[:, None] + t).astype(jnp.int32)


class QKNorm(nnx.Module):
    """RMSNorm over the head dim of q and of k (one learnt scale [head_dim] each, epsilon added to the mean
    square), as in Brumby, OLMo 2 and Qwen3."""

    def __init__(self, head_dim: int, *, epsilon: float = 1e-6, dtype, param_dtype, rngs: nnx.Rngs):
        names = logical_param("head_dim")
        norm = lambda: nnx.RMSNorm(
            head_dim, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, scale_metadata=names, rngs=rngs
        )
        self.q_norm, self.k_norm = norm(), norm()

    def __call__(self, q_BTHd, k_BTHd):
        """(q, k) normalised over their last axis: [B, T, Hq, d] and [B, T, H, d]."""
        return self.q_norm(q_BTHd), self.k_norm(k_BTHd)


class SwiGLU(nnx.Module):
    """The gated MLP of the blocks: down(silu(gate(x)) * up(x)), [B, T, D] -> [B, T, D], no biases; kernels
    ("embed", "mlp") and ("mlp", "embed") in logical axes, the hidden activations ("batch", "sequence", "mlp")."""

    def __init__(self, d_model: int, hidden: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        linear = lambda i, o, names: nnx.Linear(
            i, o, use_bias=False, kernel_metadata=logical_param(*names), dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        self.gate = linear(d_model, hidden, ("embed", "mlp"))
        self.up = linear(d_model, hidden, ("embed", "mlp"))
        self.down = linear(hidden, d_model, ("mlp", "embed"))

    def __call__(self, x_BTD: Float[Array, "B T D"]) -> Float[Array, "B T D"]:
        return self.down(constrain(nnx.silu(self.gate(x_BTD)) * self.up(x_BTD), BTF))
