"""RetentionState (degree 2) to and from the expanded state of the Pallas kernels (`pallas_kernels.power_retention`):
S_exp[a, b, :] = sum_j k_ja k_jb v_j [d, d, e] and Z[a, b] = sum_j k_ja k_jb [d, d], both symmetric in (a, b).

phi's entry (a, b), a <= b, at index off(a) + (b - a) in phi's order (sympow.py), is x_a x_b times its weight
(sqrt(2) off the diagonal, 1 on it), so S[index(a, b)] = weight(a, b) S_exp[a, b].
"""

import math
from functools import cache

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from retention.ops.power_retention.state import RetentionState
from retention.ops.power_retention.sympow import sympow_weights


@cache
def _tables(d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """index [d, d] of (min(a,b), max(a,b)) in phi's order, its weight [d, d], and the (a, b) of each of phi's D
    entries (flat index a * d + b, a <= b), [D]."""
    a, b = np.meshgrid(np.arange(d), np.arange(d), indexing="ij")
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    index = lo * d - lo * (lo - 1) // 2 + (hi - lo)
    weight = sympow_weights(d, 2)[index]
    upper = np.flatnonzero((a <= b).ravel())
    return index, weight, upper


def _gather_rows(x, d: int):
    """x [B, H, D, ...] in phi's order -> [B, H, d, d, ...], entry (a, b) = x[index(a, b)] / weight(a, b)."""
    index, weight, _ = _tables(d)
    w = jnp.asarray(weight.ravel(), x.dtype).reshape((d * d,) + (1,) * (x.ndim - 3))
    out = jnp.take(x, jnp.asarray(index.ravel()), axis=2) / w
    return out.reshape(x.shape[:2] + (d, d) + x.shape[3:])


def _upper_rows(x, d: int):
    """x [B, H, d, d, ...] symmetric in (a, b) -> [B, H, D, ...] in phi's order, times weight(a, b)."""
    _, weight, upper = _tables(d)
    flat = x.reshape(x.shape[:2] + (d * d,) + x.shape[4:])
    w = jnp.asarray(weight.ravel()[upper], x.dtype).reshape((len(upper),) + (1,) * (x.ndim - 4))
    return jnp.take(flat, jnp.asarray(upper), axis=2) * w


def to_expanded(state: RetentionState) -> tuple[Float[Array, "B H d d e"], Float[Array, "B H d d"]]:
    """RetentionState (S [B, H, D, d], z [B, H, D]) -> (S_exp [B, H, d, d, d], Z [B, H, d, d]), float32."""
    d = math.isqrt(8 * state.z.shape[-1] + 1) // 2  # D = d (d + 1) / 2
    return _gather_rows(state.S.astype(jnp.float32), d), _gather_rows(state.z.astype(jnp.float32), d)


def from_expanded(S_exp: Float[Array, "B H d d e"], Z: Float[Array, "B H d d"]) -> RetentionState:
    """Inverse of `to_expanded` (the kernels keep S_exp and Z symmetric, so the upper triangle is all of it)."""
    d = Z.shape[-1]
    return RetentionState(S=_upper_rows(S_exp, d), z=_upper_rows(Z, d))
