"""Dense causal softmax attention, O(T^2) memory: the oracle for the blockwise, cached and context-parallel paths."""

import jax
import jax.numpy as jnp
from einops import rearrange

from retention.ops.attention.scores import visible


def dense_attention(q, k, v, *, window=None, scale):
    """Masked dense softmax attention (float64 for float64 inputs, else float32); shapes as `softmax_attention`'s,
    returns v's dtype."""
    T, H = q.shape[1], k.shape[2]
    dtype = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    q_g = rearrange(q.astype(dtype), "B T (H g) d -> B H g T d", H=H)
    s = jnp.einsum("bhgid,bjhd->bhgij", q_g * scale, k.astype(dtype))
    pos = jnp.arange(T)
    s = jnp.where(visible(pos[:, None], pos[None, :], window), s, -jnp.inf)
    y = jnp.einsum("bhgij,bjhd->bhgid", jax.nn.softmax(s, axis=-1), v.astype(dtype))
    return rearrange(y, "B H g T d -> B T (H g) d").astype(v.dtype)
