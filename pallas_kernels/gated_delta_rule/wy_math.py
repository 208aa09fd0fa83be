"""The per-chunk WY/UT operands of the gated delta rule, on values: forward and gradients (every kernel of
operands.py calls these).

Per chunk of c tokens of one kv-head (F the cumulative log-gates, R the reset counts, as columns [c, 1] and rows
[1, c]; D_ij = exp(F_i - F_j) for j <= i in one document, `kernel_math.causal_decay`; f_q = exp(F) where R == 0):
    L = strictly_lower(beta_i (k_i . k_j) D_ij),   (I + L) U = beta v,   (I + L) W = beta f_q k,
    A_r = (q_r k^T) * D for each query head r.
The unit-triangular systems are solved by forward substitution, one row per step: row i of X is the right side's
row i minus sum_j L_ij X_j, L's row i read as a column of L^T (built directly, no transpose). The backward solves
(I + L)^T Y = dX by back substitution (row i minus sum_j L_ji Y_j), then dL = -(Y_U U^T + Y_W W^T) on the strict
lower triangle, and the chain rule through L, the right sides and A to k, v, beta, q and F.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from pallas_kernels.matrix_state import put_row, row
from pallas_kernels.power_retention.kernel_math import F32, Matmul, causal_decay, column, dot, visible


def _lower(c: int, transpose: bool = False):
    """The strictly lower [c, c] mask (with transpose: strictly upper)."""
    rows = jax.lax.broadcasted_iota(jnp.int32, (c, c), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (c, c), 1)
    return cols > rows if transpose else cols < rows


def _query_factor(Fc, Rc):
    """f_q [c, 1]: exp(F) where R == 0, else 0."""
    read = Rc == 0
    return jnp.where(read, jnp.exp(jnp.where(read, Fc, 0.0)), 0.0)


def _substitute(columns, rights, reverse: bool):
    """X with row i = rights' row i - sum_j columns(i)_j X_j, rows in order (or reversed), for each right side."""
    c = rights[0].shape[0]

    def body(t, xs):
        i = c - 1 - t if reverse else t
        coef = columns(i)
        return tuple(
            x + put_row(row(b, i) - jnp.sum(coef * x, axis=0, keepdims=True), i, c) for x, b in zip(xs, rights)
        )

    return jax.lax.fori_loop(jnp.int32(0), jnp.int32(c), body, tuple(jnp.zeros(b.shape, F32) for b in rights))


def operands(
    qs: list,
    k: Float[Array, "c dk"],
    v: Float[Array, "c dv"],
    beta_c: Float[Array, "c 1"],
    beta_r: Float[Array, "1 c"],
    Fc: Float[Array, "c 1"],
    Fr: Float[Array, "1 c"],
    Rc: Float[Array, "c 1"],
    Rr: Float[Array, "1 c"],
    mm: Matmul,
):
    """One chunk's operands (module docstring).

    Args:
        qs: the scaled queries of each query head, [c, d_k] each.
        k: keys.
        v: values.
        beta_c: the write strengths as a column.
        beta_r: the same as a row.
        Fc: the cumulative log-gates as a column.
        Fr: the same as a row.
        Rc: the reset counts as a column.
        Rr: the same as a row.
        mm: the matmuls' operand dtype and precision.

    Returns:
        (the A_r [c, c] of each head, W [c, d_k], U [c, d_v]), float32.
    """
    c = k.shape[0]
    D = causal_decay(Fc, Fr, visible(Rc, Rr))
    DT = causal_decay(Fc, Fr, visible(Rc, Rr, transpose=True), transpose=True)
    G = dot(k, k, mm, trans_y=True)
    LT = jnp.where(_lower(c, transpose=True), beta_r * G * DT, 0.0)  # LT[j, i] = L[i, j]
    U, W = _substitute(lambda i: column(LT, i), (beta_c * v, beta_c * _query_factor(Fc, Rc) * k), reverse=False)
    return [dot(q, k, mm, trans_y=True) * D for q in qs], W, U


def operand_grads(qs, k, v, beta_c, Fc, Fr, Rc, Rr, U, W, dU, dW, dAs: list, mm: Matmul):
    """The gradients of `operands` given those of its results.

    Args:
        qs, k, v, beta_c, Fc, Fr, Rc, Rr, mm: as in `operands`.
        U: its U.
        W: its W.
        dU: U's cotangent.
        dW: W's.
        dAs: each A_r's.

    Returns:
        (dq_r [c, d_k] of each head, dk [c, d_k], dv [c, d_v], dbeta [c, 1], dF as the column's [c, 1] and the
            row's [1, c] shares), float32; beta and F each enter once in total (their row views take none).
    """
    c = k.shape[0]
    D = causal_decay(Fc, Fr, visible(Rc, Rr))
    G = dot(k, k, mm, trans_y=True)
    strict = _lower(c)
    L = jnp.where(strict, beta_c * G * D, 0.0)
    Y_U, Y_W = _substitute(lambda i: column(L, i), (dU, dW), reverse=True)
    dL = jnp.where(strict, -(dot(Y_U, U, mm, trans_y=True) + dot(Y_W, W, mm, trans_y=True)), 0.0)
    dG, dD = dL * beta_c * D, dL * beta_c * G
    f_q = _query_factor(Fc, Rc)
    t = jnp.sum(k * Y_W, axis=1, keepdims=True)
    dk = dot(dG, k, mm) + dot(dG, k, mm, trans_x=True) + beta_c * f_q * Y_W
    dbeta = jnp.sum(dL * G * D, axis=1, keepdims=True) + jnp.sum(v * Y_U, axis=1, keepdims=True) + f_q * t
    dFc = f_q * beta_c * t
    dqs = []
    for q, dA in zip(qs, dAs):
        dP = dA * D
        dqs.append(dot(dP, k, mm))
        dk = dk + dot(dP, q, mm, trans_x=True)
        dD = dD + dA * dot(q, k, mm, trans_y=True)
    dE = dD * D
    return dqs, dk, beta_c * Y_U, dbeta, dFc + jnp.sum(dE, axis=1, keepdims=True), -jnp.sum(dE, axis=0, keepdims=True)
