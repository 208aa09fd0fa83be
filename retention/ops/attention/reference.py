"""Dense causal softmax attention, O(T^2) memory: the oracle for the blockwise, cached and context-parallel paths."""

import jax
import jax.numpy as jnp
from einops import rearrange

from retention.ops.attention.scores import poison_nonfinite, visible


def dense_attention(q, k, v, *, window=None, segment_ids=None, scale):
    """Masked dense softmax attention (float64 for float64 inputs, else float32); shapes as `softmax_attention`'s,
    returns v's dtype. Non-finite inputs as every path (`scores.poison_nonfinite`)."""
    q, k, v = poison_nonfinite(q, k, v)
    T, H = q.shape[1], k.shape[2]
    dtype = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    q_g = rearrange(q.astype(dtype), "B T (H g) d -> B H g T d", H=H)
    s = jnp.einsum("bhgid,bjhd->bhgij", q_g * scale, k.astype(dtype))
    pos = jnp.arange(T)
    seg = (None, None)
    if segment_ids is not None:  # [B, 1, 1, T, 1] against [B, 1, 1, 1, T]
        seg = (segment_ids[:, None, None, :, None], segment_ids[:, None, None, None, :])
    s = jnp.where(visible(pos[:, None], pos[None, :], window, *seg), s, -jnp.inf)
    y = jnp.einsum("bhgij,bjhd->bhgid", jax.nn.softmax(s, axis=-1), v.astype(dtype))
    return rearrange(y, "B H g T d -> B T (H g) d").astype(v.dtype)
