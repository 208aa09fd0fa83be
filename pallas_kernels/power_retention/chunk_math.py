"""The per-chunk arithmetic of degree-2 power retention, on values (no refs): every kernel calls these.

Conventions inside a chunk of c tokens (one kv-head): G is the inclusive cumsum of log_g from the chunk's start, given
as a column Gc [c, 1] and as a row Gr [1, c]; G_end = G[c-1]. q~ = scale q exp(G/2) (the query read against the state
carried into the chunk), k~ = k exp((G_end - G)/2) (the key written into the state carried out), gamma = exp(G_end).
Rows a of the expanded state (see the package docstring) are [d, e] matrices; `a` may be a traced index.
"""

import jax
import jax.numpy as jnp

DEG = 2
F32 = jnp.float32


def dot(x, y, precision, *, trans_x=False, trans_y=False):
    """x @ y in float32 with x or y optionally transposed (contracting dim 0 of x, or dim 1 of y)."""
    dims = (((0,) if trans_x else (1,), (1,) if trans_y else (0,)), ((), ()))
    return jax.lax.dot_general(x, y, dims, precision=precision, preferred_element_type=F32)


def column(x, a):
    """x[:, a] as a [r, 1] column, for a traced a (a masked sum: no dynamic lane slicing)."""
    lane = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    return jnp.sum(jnp.where(lane == a, x, 0.0), axis=1, keepdims=True)


def put_column(col, a, d: int):
    """A [r, d] array that is `col` [r, 1] in column a and zero elsewhere."""
    lane = jax.lax.broadcasted_iota(jnp.int32, (col.shape[0], d), 1)
    return jnp.where(lane == a, col, 0.0)


def last_row(x):
    """x[c-1] of a [c, 1] column, as [1, 1]."""
    row = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
    return jnp.sum(jnp.where(row == x.shape[0] - 1, x, 0.0), axis=0, keepdims=True)


def gate_factors(Gc, Gr, scale):
    """(q factor scale exp(G/2) [c, 1], k factor exp((G_end - G)/2) [c, 1], gamma exp(G_end) [1, 1])."""
    G_end = jnp.sum(
        jnp.where(jax.lax.broadcasted_iota(jnp.int32, Gr.shape, 1) == Gr.shape[1] - 1, Gr, 0.0), axis=1, keepdims=True
    )
    return scale * jnp.exp(Gc / DEG), jnp.exp((G_end - Gc) / DEG), jnp.exp(G_end)


def feature_row(x_t, a):
    """Row a of the expanded feature map of each row of x~ [r, d]: x~ * x~[:, a], [r, d]."""
    return x_t * column(x_t, a)


def read_row(x_t, S_a, a, precision):
    """This row's share of phi(x~) S: (x~ * x~_a) @ S_exp[a], [r, e]."""
    return dot(feature_row(x_t, a), S_a, precision)


def write_row(x_t, u, a, precision):
    """This row's share of phi(x~)^T u: (x~ * x~_a)^T @ u, [d, e]."""
    return dot(feature_row(x_t, a), u, precision, trans_x=True)


def read_row_grad(x_t, u, S_a, a, precision):
    """d/dx~ of sum_i u_i . read_row(x~, S_a)_i for symmetric S: column a of 2 x~ (u S_a^T) summed, [r, d]."""
    t = dot(u, S_a, precision, trans_y=True)
    return put_column(2.0 * jnp.sum(x_t * t, axis=1, keepdims=True), a, x_t.shape[1])


def causal_decay(Gc, Gr, transpose=False):
    """exp(G_i - G_j) for j <= i else 0, [c, c] (rows i); with transpose, its transpose (rows j), built directly."""
    shape = (Gc.shape[0], Gr.shape[1])
    row = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    col = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    keep = col >= row if transpose else col <= row
    diff = Gr - Gc if transpose else Gc - Gr
    return jnp.where(keep, jnp.exp(jnp.where(keep, diff, 0.0)), 0.0)


def intra(q, k, v, Gc, Gr, scale, precision):
    """Inside the chunk: A = (scale q k^T)^2 * causal_decay; returns (A v [c, e], A 1 [c, 1])."""
    s = scale * dot(q, k, precision, trans_y=True)
    A = s * s * causal_decay(Gc, Gr)
    return dot(A, v, precision), jnp.sum(A, axis=1, keepdims=True)


def intra_grads(q, k, v, Gc, Gr, dnum, dden, dden_row, scale, precision):
    """Gradients of `intra` given d(A v) = dnum [c, e] and d(A 1) = dden [c, 1] (also as a row [1, c]).

    Returns (dq [c, d], dk [c, d], dv [c, e], dG of the query rows [c, 1], dG of the key rows [c, 1]). The key side
    is computed on A^T directly, so no [c, c] transpose is needed.
    """
    s = scale * dot(q, k, precision, trans_y=True)
    decay = causal_decay(Gc, Gr)
    A = s * s * decay
    dA = dot(dnum, v, precision, trans_y=True) + dden
    dq = scale * dot(dA * DEG * s * decay, k, precision)
    dGq = jnp.sum(dA * A, axis=1, keepdims=True)

    sT = scale * dot(k, q, precision, trans_y=True)
    decayT = causal_decay(Gc, Gr, transpose=True)
    AT = sT * sT * decayT
    dAT = dot(v, dnum, precision, trans_y=True) + dden_row
    dk = scale * dot(dAT * DEG * sT * decayT, q, precision)
    dv = dot(AT, dnum, precision)
    dGk = -jnp.sum(dAT * AT, axis=1, keepdims=True)
    return dq, dk, dv, dGq, dGk
