"""The per-chunk arithmetic of degree-2 power retention, on values (no refs): every kernel calls these.

Gates inside a chunk of c tokens (one kv-head), as the caller gives them (see the package docstring): F, the inclusive
cumulative sum of the log-gates from the chunk's start with every reset token's gate taken as 0, and R, the number of
resets up to each token (float32). Each comes as a column [c, 1] (Fc, Rc) and as a row [1, c] (Fr, Rr); F_end and
R_end are the chunk's last entries. Then:
- query i reads the state carried into the chunk as q~ = scale q exp(F/2) if R_i == 0 (else it reads nothing);
- key j enters the state carried out as k~ = k exp((F_end - F_j)/2) if R_j == R_end (else it is not written);
- the carried state decays by gamma = exp(F_end) if R_end == 0 (else it is dropped);
- inside the chunk, the decay from key j to query i is exp(F_i - F_j) if j <= i and R_i == R_j, else 0.
Every exponent is <= 0. Masks are `jnp.where` selections, never products with 0, so a NaN in one document never
reaches another's rows as 0 * NaN and a NaN is never turned into 0.

Matmuls: `Matmul(dtype, precision)` says what the operands are cast to (bf16 for bf16 inputs: tensor-core rate; float32
with HIGHEST precision for float32 inputs); products always accumulate in float32.
Rows a of the expanded state (see the package docstring) are [d, e] matrices; `a` may be a traced index.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

DEG = 2
F32 = jnp.float32


class Matmul(NamedTuple):
    """Operand dtype and precision of the kernels' matmuls (float32 accumulation always)."""

    dtype: jnp.dtype
    precision: jax.lax.Precision


def dot(x, y, mm: Matmul, *, trans_x=False, trans_y=False):
    """x @ y with x or y optionally transposed (contracting dim 0 of x, or dim 1 of y); operands cast to mm.dtype,
    accumulated and returned in float32."""
    dims = (((0,) if trans_x else (1,), (1,) if trans_y else (0,)), ((), ()))
    x, y = x.astype(mm.dtype), y.astype(mm.dtype)
    return jax.lax.dot_general(x, y, dims, precision=mm.precision, preferred_element_type=F32)


def column(x, a):
    """x[:, a] as a [r, 1] column, for a traced a (a masked sum: no dynamic lane slicing)."""
    lane = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    return jnp.sum(jnp.where(lane == a, x, 0.0), axis=1, keepdims=True)


def put_column(col, a, d: int):
    """A [r, d] array that is `col` [r, 1] in column a and zero elsewhere."""
    lane = jax.lax.broadcasted_iota(jnp.int32, (col.shape[0], d), 1)
    return jnp.where(lane == a, col, 0.0)


def last_of_row(xr):
    """xr[0, c-1] of a [1, c] row, as [1, 1]."""
    lane = jax.lax.broadcasted_iota(jnp.int32, xr.shape, 1)
    return jnp.sum(jnp.where(lane == xr.shape[1] - 1, xr, 0.0), axis=1, keepdims=True)


class Gates(NamedTuple):
    """The masked gate factors of one chunk (module docstring): fq [c, 1] (scale included) with its keep mask
    read [c, 1] (R_i == 0), fk [c, 1] with write [c, 1] (R_j == R_end), gamma [1, 1] with carry [1, 1] (R_end == 0).
    Each factor is 0 where its mask is False."""

    fq: jax.Array
    read: jax.Array
    fk: jax.Array
    write: jax.Array
    gamma: jax.Array
    carry: jax.Array


def gates(Fc, Fr, Rc, Rr, scale) -> Gates:
    """The chunk's masked gate factors from F and R as columns [c, 1] and rows [1, c]."""
    F_end, R_end = last_of_row(Fr), last_of_row(Rr)
    read, write, carry = Rc == 0, Rc == R_end, R_end == 0
    fq = jnp.where(read, scale * jnp.exp(jnp.where(read, Fc, 0.0) / DEG), 0.0)
    fk = jnp.where(write, jnp.exp(jnp.where(write, F_end - Fc, 0.0) / DEG), 0.0)
    gamma = jnp.where(carry, jnp.exp(jnp.where(carry, F_end, 0.0)), 0.0)
    return Gates(fq, read, fk, write, gamma, carry)


def scaled(x, factor, keep):
    """x * factor where `keep` (rows), 0 elsewhere: a selection, so a NaN in a dropped row stays out."""
    return jnp.where(keep, x * factor, 0.0)


def feature_row(x_t, a):
    """Row a of the expanded feature map of each row of x~ [r, d]: x~ * x~[:, a], [r, d]."""
    return x_t * column(x_t, a)


def read_row(x_t, S_a, a, mm: Matmul):
    """This row's share of phi(x~) S: (x~ * x~_a) @ S_exp[a], [r, e]."""
    return dot(feature_row(x_t, a), S_a, mm)


def write_row(x_t, u, a, mm: Matmul):
    """This row's share of phi(x~)^T u: (x~ * x~_a)^T @ u, [d, e]."""
    return dot(feature_row(x_t, a), u, mm, trans_x=True)


def read_row_grad(x_t, u, S_a, a, mm: Matmul):
    """d/dx~ of sum_i u_i . read_row(x~, S_a)_i for symmetric S: column a of 2 x~ (u S_a^T) summed, [r, d]."""
    t = dot(u, S_a, mm, trans_y=True)
    return put_column(2.0 * jnp.sum(x_t * t, axis=1, keepdims=True), a, x_t.shape[1])


def visible(Rc, Rr, transpose=False):
    """[c, c] mask of the (query i, key j) pairs inside the chunk: j <= i and R_i == R_j; rows i (with transpose:
    its transpose, rows j, built directly)."""
    shape = (Rc.shape[0], Rr.shape[1])
    row = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    col = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return ((col >= row) if transpose else (col <= row)) & (Rc == Rr)


def causal_decay(Fc, Fr, keep, transpose=False):
    """exp(F_i - F_j) where `keep` (from `visible`) else 0, [c, c] (rows i; with transpose, rows j)."""
    diff = Fr - Fc if transpose else Fc - Fr
    return jnp.where(keep, jnp.exp(jnp.where(keep, diff, 0.0)), 0.0)


def intra(q, k, v, Fc, Fr, Rc, Rr, scale, mm: Matmul):
    """Inside the chunk: A = (scale q k^T)^2 * decay; returns (A v [c, e], A 1 [c, 1]).

    A non-finite v_j reaches exactly the rows that see key j (and only in its own columns): A is a selection, but
    A v would multiply the 0 entries of A by v_j, so v is cleaned before the product and its non-finite entries
    are put back as NaN in the rows that see them (one more [c, c] @ [c, e] product, of 0/1 values)."""
    keep = visible(Rc, Rr)
    s = scale * dot(q, k, mm, trans_y=True)
    A = jnp.where(keep, s * s * causal_decay(Fc, Fr, keep), 0.0)
    finite = jnp.isfinite(v)
    num = dot(A, jnp.where(finite, v, 0.0), mm)
    poisoned = dot(jnp.where(keep, 1.0, 0.0), jnp.where(finite, 0.0, 1.0), mm) > 0
    return jnp.where(poisoned, jnp.nan, num), jnp.sum(A, axis=1, keepdims=True)


def normalise(num, den):
    """num / den, NaN where den == 0 (every weight underflowed; padding rows, which the caller crops, and whose
    gradient the VJP sets to 0); a NaN den stays NaN."""
    zero = den == 0
    return jnp.where(zero, jnp.nan, num / jnp.where(zero, 1.0, den))


def intra_grads(q, k, v, Fc, Fr, Rc, Rr, dnum, dden, dden_row, scale, mm: Matmul):
    """Gradients of `intra` given d(A v) = dnum [c, e] and d(A 1) = dden [c, 1] (also as a row [1, c]).

    Returns (dq [c, d], dk [c, d], dv [c, e], dF of the query rows [c, 1], dF of the key rows [c, 1]). The key side
    is computed on A^T directly, so no [c, c] transpose is needed.
    """
    keep = visible(Rc, Rr)
    s = scale * dot(q, k, mm, trans_y=True)
    decay = causal_decay(Fc, Fr, keep)
    A = s * s * decay
    dA = dot(dnum, v, mm, trans_y=True) + dden
    dq = scale * dot(dA * DEG * s * decay, k, mm)
    dFq = jnp.sum(dA * A, axis=1, keepdims=True)

    keepT = visible(Rc, Rr, transpose=True)
    sT = scale * dot(k, q, mm, trans_y=True)
    decayT = causal_decay(Fc, Fr, keepT, transpose=True)
    AT = sT * sT * decayT
    dAT = dot(v, dnum, mm, trans_y=True) + dden_row
    dk = scale * dot(dAT * DEG * sT * decayT, q, mm)
    dv = dot(AT, dnum, mm)
    dFk = -jnp.sum(dAT * AT, axis=1, keepdims=True)
    return dq, dk, dv, dFq, dFk
