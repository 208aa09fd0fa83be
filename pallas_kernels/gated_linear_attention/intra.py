"""The intra-chunk arithmetic of chunked gated linear attention, on values (no refs), one sub-chunk pair at a time.

Inside a chunk of one kv-head (one query head at a time), F [c, d_k] is the inclusive cumulative log-gate per key
channel from the chunk's start and R the reset count (the package docstring); with q already scaled,
A_ij = sum_m q_im k_jm exp(F_im - F_jm) for j <= i with R_i == R_j, else 0, and the chunk's own part of o_i is
sum_j A_ij v_j. The chunk is cut into sub-chunks of s tokens, I holding the queries and J the keys:
- J < I (`off_diagonal`): the exponent splits at I's first token r, (q_i exp(F_i - F_r)) . (k_j exp(F_r - F_j)),
  two matmul operands whose exponents are both <= 0 (F never increases along the chunk);
- J = I (`diagonal`): one key token j at a time (a loop over the s keys), column j of A_II is
  sum_m q_im k_jm exp(F_im - F_jm) for the rows i >= j of j's document, the exponent masked (a `where`) before the
  exp.
No exponent is ever positive, so strong decays stay finite; masks are selections, never products with 0.
Gradients, given dO (the output's cotangent rows): dA = dO v^T on the visible pairs, dq_i = sum_j dA_ij k_j e_ij,
dk_j = sum_i dA_ij q_i e_ij (e_ij the per-channel decay), dv = A^T dO. F's gradient is q . dq - k . dk per token
(the exponent is linear in F_i and in -F_j), which the caller forms from these.
Rows of a value are taken by masked sums (`row`, pallas_kernels/matrix_state.py), so nothing slices a value (Triton
cannot) and a traced index works.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from pallas_kernels.matrix_state import put_row, row
from pallas_kernels.power_retention.kernel_math import F32, Matmul, dot


def _split(q_I, F_I, k_J, F_J):
    """The split factors of an earlier sub-chunk pair: (q_I e_q, k_J e_k, e_q, e_k) with e_q = exp(F_I - F_r),
    e_k = exp(F_r - F_J), r the first token of I; both exponents <= 0."""
    F_r = row(F_I, 0)
    e_q, e_k = jnp.exp(F_I - F_r), jnp.exp(F_r - F_J)
    return q_I * e_q, k_J * e_k, e_q, e_k


def off_diagonal(
    q_I: Float[Array, "s dk"],
    F_I: Float[Array, "s dk"],
    Rc_I: Float[Array, "s 1"],
    k_J: Float[Array, "s dk"],
    v_J: Float[Array, "s dv"],
    F_J: Float[Array, "s dk"],
    Rr_J: Float[Array, "1 s"],
    mm: Matmul,
) -> Float[Array, "s dv"]:
    """The part of sub-chunk I's outputs from the keys of an earlier sub-chunk J of the same chunk.

    Args:
        q_I: the (scaled) queries of I.
        F_I: their cumulative log-gates.
        Rc_I: their reset counts, as a column.
        k_J: the keys of J.
        v_J: their values.
        F_J: their cumulative log-gates.
        Rr_J: their reset counts, as a row.
        mm: the matmuls' operand dtype and precision.

    Returns:
        sum over j in J of A_ij v_j for the rows i of I, float32.
    """
    q_s, k_s, _, _ = _split(q_I, F_I, k_J, F_J)
    A = jnp.where(Rc_I == Rr_J, dot(q_s, k_s, mm, trans_y=True), 0.0)
    return dot(A, v_J, mm)


def off_diagonal_grads(q_I, F_I, Rc_I, k_J, v_J, F_J, Rr_J, do_I: Float[Array, "s dv"], mm: Matmul):
    """The gradients of `off_diagonal` (same arguments) given the cotangent do_I of its result.

    Args:
        q_I, F_I, Rc_I, k_J, v_J, F_J, Rr_J, mm: as in `off_diagonal`.
        do_I: the cotangent of I's output rows [s, d_v].

    Returns:
        (dq_I [s, d_k], dk_J [s, d_k], dv_J [s, d_v]), float32.
    """
    q_s, k_s, e_q, e_k = _split(q_I, F_I, k_J, F_J)
    same = Rc_I == Rr_J
    A = jnp.where(same, dot(q_s, k_s, mm, trans_y=True), 0.0)
    dA = jnp.where(same, dot(do_I, v_J, mm, trans_y=True), 0.0)
    dq = dot(dA, k_s, mm) * e_q
    dk = dot(dA, q_s, mm, trans_x=True) * e_k
    return dq, dk, dot(A, do_I, mm, trans_x=True)


def _key_column(q_I, k_I, F_I, Rc_I, j):
    """Key j of sub-chunk I against its rows: (e [s, d_k], exp(F_i - F_j) on the visible rows i >= j of j's
    document, else 0; k_j [1, d_k]; a [s, 1], column j of A_II; keep [s, 1], the visible rows)."""
    k_j, F_j, R_j = row(k_I, j), row(F_I, j), row(Rc_I, j)
    keep = (jax.lax.broadcasted_iota(jnp.int32, Rc_I.shape, 0) >= j) & (Rc_I == R_j)
    e = jnp.where(keep, jnp.exp(jnp.where(keep, F_I - F_j, 0.0)), 0.0)
    return e, k_j, jnp.sum(q_I * k_j * e, axis=1, keepdims=True), keep


def diagonal(
    q_I: Float[Array, "s dk"],
    k_I: Float[Array, "s dk"],
    v_I: Float[Array, "s dv"],
    F_I: Float[Array, "s dk"],
    Rc_I: Float[Array, "s 1"],
) -> Float[Array, "s dv"]:
    """The part of sub-chunk I's outputs from its own keys, a loop over them (module docstring), float32.

    Args:
        q_I: the (scaled) queries of I.
        k_I: its keys.
        v_I: its values.
        F_I: its cumulative log-gates.
        Rc_I: its reset counts, as a column.

    Returns:
        sum over j in I, j <= i, of A_ij v_j for the rows i of I.
    """
    s = q_I.shape[0]

    def body(j, o):
        _, _, a, _ = _key_column(q_I, k_I, F_I, Rc_I, j)
        return o + a * row(v_I, j)

    return jax.lax.fori_loop(jnp.int32(0), jnp.int32(s), body, jnp.zeros((s, v_I.shape[1]), F32))


def diagonal_grads(q_I, k_I, v_I, F_I, Rc_I, do_I: Float[Array, "s dv"]):
    """The gradients of `diagonal` (same arguments) given the cotangent do_I of its result.

    Args:
        q_I, k_I, v_I, F_I, Rc_I: as in `diagonal`.
        do_I: the cotangent of I's output rows [s, d_v].

    Returns:
        (dq_I [s, d_k], dk_I [s, d_k], dv_I [s, d_v]), float32.
    """
    s = q_I.shape[0]

    def body(j, acc):
        dq, dk, dv = acc
        e, k_j, a, keep = _key_column(q_I, k_I, F_I, Rc_I, j)
        dA = jnp.where(keep, jnp.sum(do_I * row(v_I, j), axis=1, keepdims=True), 0.0)
        dq = dq + dA * k_j * e
        dk = dk + put_row(jnp.sum(dA * q_I * e, axis=0, keepdims=True), j, s)
        dv = dv + put_row(jnp.sum(a * do_I, axis=0, keepdims=True), j, s)
        return dq, dk, dv

    zeros = lambda n: jnp.zeros((s, n), F32)
    init = (zeros(q_I.shape[1]), zeros(k_I.shape[1]), zeros(v_I.shape[1]))
    return jax.lax.fori_loop(jnp.int32(0), jnp.int32(s), body, init)
