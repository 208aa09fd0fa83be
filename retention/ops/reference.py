"""The quadratic oracle for power retention, evaluated in log space (DESIGN section 1).

s_ij = p * log(|scale q_i . k_j| + 1e-7) + G_i - G_j for j <= i, the row max subtracted, and 1e-6 added to the
normaliser in that row-max space. Costs O(T^2) memory: for tests and small inputs only.
"""

import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float


def power_retention_reference(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    log_g: Float[Array, "B T H"] | None = None,
    *,
    deg: int = 2,
    scale: float | None = None,
) -> Float[Array, "B T Hq d"]:
    """y_i = sum_{j<=i} w_ij v_j / sum_j w_ij with w_ij = (scale q_i.k_j)^deg * exp(G_i - G_j).

    Computes in float64 when the inputs are float64, else float32; returns the dtype of v.
    """
    dtype = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    _, T, Hq, d = q.shape
    H = k.shape[2]
    scale = d**-0.5 if scale is None else scale
    q_BHgTd = rearrange(q.astype(dtype), "B T (H g) d -> B H g T d", H=H)
    k_BHTd = rearrange(k.astype(dtype), "B T H d -> B H T d")
    v_BHTd = rearrange(v.astype(dtype), "B T H d -> B H T d")
    logits = deg * jnp.log(jnp.abs(scale * jnp.einsum("bhgid,bhjd->bhgij", q_BHgTd, k_BHTd)) + 1e-7)
    if log_g is not None:
        G_BHT = rearrange(jnp.cumsum(log_g.astype(dtype), axis=1), "B T H -> B H T")
        logits = logits + (G_BHT[:, :, None, :, None] - G_BHT[:, :, None, None, :])
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    logits = jnp.where(causal, logits, -jnp.inf)
    weights = jnp.exp(logits - logits.max(axis=-1, keepdims=True))
    y = jnp.einsum("bhgij,bhjd->bhgid", weights, v_BHTd) / (weights.sum(axis=-1)[..., None] + 1e-6)
    return rearrange(y, "B H g T d -> B T (H g) d").astype(v.dtype)
