"""The block arithmetic of the Mosaic GPU forward (mosaic_forward.py), on values: the kernels call these on
register arrays, the emulation (mosaic_emulation.py) on jnp arrays, so both round at the same points.

Vectors are 1-D and broadcast with `lax.broadcast_in_dim` (what Mosaic GPU lowers for its row and column layouts):
`rows(x, shape)` repeats a vector over the columns of `shape` (one value per row), `cols(x, shape)` over its rows.
Matmul operands are bf16 (or fp16), products accumulate in float32; an operand built here is computed in float32
and rounded once. Masks compare float32 values, so no boolean vector is broadcast.
"""

import jax
import jax.numpy as jnp

from pallas_kernels.power_retention.kernel_math import F32


def rows(x, shape):
    """Vector x [shape[0]] repeated over the columns: [m, n] with [i, :] = x[i]."""
    return jax.lax.broadcast_in_dim(x, shape, [0])


def cols(x, shape):
    """Vector x [shape[1]] repeated over the rows: [m, n] with [:, j] = x[j]."""
    return jax.lax.broadcast_in_dim(x, shape, [1])


def feature_lhs(x, scale_by, axis: int):
    """One row a of the expanded feature map as a matmul operand: x [m, n] (bf16) times the vector `scale_by`
    (x~[:, a] for every token) along `axis` (0: one value per row of x, 1: per column), in float32, rounded
    once to x's dtype.

    State pass: x = k~^T [d, c], scale_by = k~[:, a] per column: (k~ * k~_a)^T, the lhs of (k~ * k~_a)^T v.
    Output: x = q~ [c, d], scale_by = q~[:, a] per row: q~ * q~_a, the lhs of (q~ * q~_a) S_exp[a]."""
    spread = rows if axis == 0 else cols
    return (x.astype(F32) * spread(scale_by.astype(F32), x.shape)).astype(x.dtype)


def carried(S, gamma, carry):
    """The state carried into the next chunk before its increment: gamma S where carry > 0, else 0 (a reset
    drops S, so a non-finite S stays out). S [d, e] float32; gamma, carry [d] (the chunk's values repeated)."""
    keep = rows(carry, S.shape) > 0
    return jnp.where(keep, rows(gamma, S.shape) * S, 0.0)


def intra_weights(s, F, F_key, R, R_key, query_ids, key_ids, scale):
    """A [c, c] = (scale s)^2 exp(F_i - F_j) where key j <= query i and R_i == R_j, else 0 (s = q k^T,
    float32). F, R [c] for the query rows, F_key, R_key [c] the same values for the key columns; query_ids and
    key_ids the [c, c] row and column indices (int32). The kernel loads the row and column copies of F and R from
    separate shared-memory buffers: two loads of one buffer in two layouts leave Mosaic GPU's layout inference
    without a solution."""
    shape = s.shape
    R_i, R_j = rows(R, shape), cols(R_key, shape)
    F_i, F_j = rows(F, shape), cols(F_key, shape)
    keep = (key_ids <= query_ids) & (R_i == R_j)
    decay = jnp.exp(jnp.where(keep, F_i - F_j, 0.0))
    scaled = scale * s
    return jnp.where(keep, scaled * scaled * decay, 0.0)


def read_mask(R):
    """1.0 for the query rows that read the carried state (R == 0), else 0.0; [c]."""
    return jnp.where(R == 0, 1.0, 0.0)


def selected_read(inter, read):
    """phi(q~) S [c, e] kept only in the rows that read the state (read [c] from `read_mask`)."""
    return jnp.where(rows(read, inter.shape) > 0, inter, 0.0)


def denominator(A, den_read, read):
    """A 1 + (phi(q~) z where the row reads the state): [c] from A [c, c] and den_read [c]."""
    return jnp.sum(A, axis=1) + jnp.where(read > 0, den_read, 0.0)


def normalised(num, den):
    """num / den per row, 0 where den == 0 (padding rows, whose num is 0 too); num [c, e], den [c]."""
    den_e = rows(den, num.shape)
    zero = den_e == 0
    return jnp.where(zero, 0.0, num / jnp.where(zero, 1.0, den_e))
