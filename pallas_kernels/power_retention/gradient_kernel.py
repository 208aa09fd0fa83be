"""The gradient kernel: dq, dk, dv and dF of one chunk and kv-head from the saved boundary states.

Inputs per chunk n: the forward state carried in (S_before, Z_before) and the gradient of the state carried out
(dS_after, dZ_after, from the reverse state pass; both in the matmul operand dtype), plus dnum = dy / den and
dden = -(dy . y) / den. Row a of the expanded state gives: dq~ (read), dk~ and dv (write) and <dS_after, S_before>
(the chunk decay's gradient); the last grid step adds the z terms, the gate-factor chain rule (kernel_math.gates:
q~ = q scale exp(F/2), k~ = k exp((F_end - F)/2), gamma = exp(F_end), each 0 outside its mask, so the masked tokens'
terms vanish with them) and the intra-chunk gradients. dF is returned per token (query and key rows); R has none.
Grid (B, H, N, row blocks) as in `output_kernel.py`: chunks in parallel, the row blocks a reduction into resident
float32 output blocks. The g = Hq / H query heads of a kv-head are handled in one program (static loop), since they
share dk and dv.
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.power_retention.config import BlockSizes, compiler_params
from pallas_kernels.power_retention.kernel_math import (
    DEG,
    F32,
    Matmul,
    dot,
    gates,
    intra_grads,
    read_row,
    read_row_grad,
    scaled,
)
from pallas_kernels.vma import out_struct

EXACT = Matmul(F32, jax.lax.Precision.HIGHEST)  # the normaliser's small [d, d] products


def _last_row_mask(shape):
    return jax.lax.broadcasted_iota(jnp.int32, shape, 0) == shape[0] - 1


def _total(x):
    """Sum of a 2-d array as [1, 1]."""
    return jnp.sum(jnp.sum(x, axis=1, keepdims=True), axis=0, keepdims=True)


def _kernel(
    q_ref,
    k_ref,
    v_ref,
    Fc_ref,
    Fr_ref,
    Rc_ref,
    Rr_ref,
    dnum_ref,
    dden_ref,
    ddenr_ref,
    S_ref,
    dS_ref,
    Z_ref,
    dZ_ref,
    dq_ref,
    dk_ref,
    dv_ref,
    dFq_ref,
    dFk_ref,
    *,
    scale,
    mm,
):
    """Accumulate the state rows' gradients; on the last step finish dq, dk, dv, dFq, dFk for the chunk."""
    j, n_steps = pl.program_id(3), pl.num_programs(3)
    rows, g = S_ref.shape[0], q_ref.shape[0]
    Fc, Fr, Rc, Rr = Fc_ref[...], Fr_ref[...], Rc_ref[...], Rr_ref[...]
    gt = gates(Fc, Fr, Rc, Rr, scale)
    fq, fk, gamma = gt.fq, gt.fk, gt.gamma
    k, v = k_ref[...].astype(F32), v_ref[...].astype(F32)
    k_t = scaled(k, fk, gt.write)
    v_w = jnp.where(gt.write, v, 0.0)
    qs = [q_ref[r].astype(F32) for r in range(g)]
    qs_t = [scaled(q, fq, gt.read) for q in qs]
    dnums = [dnum_ref[r] for r in range(g)]

    def body(i, carry):
        dqs_t, dk_t, dv, dgamma = carry
        a = j * rows + i
        S_a, dS_a = S_ref[i], dS_ref[i]
        dqs_t = tuple(dq + read_row_grad(q_t, dn, S_a, a, mm) for dq, q_t, dn in zip(dqs_t, qs_t, dnums))
        dk_t = dk_t + read_row_grad(k_t, v_w, dS_a, a, mm)
        dv = dv + read_row(k_t, dS_a, a, mm)
        return dqs_t, dk_t, dv, dgamma + _total(dS_a.astype(F32) * S_a.astype(F32))

    zeros = jnp.zeros(k.shape, F32)
    init = (tuple(zeros for _ in range(g)), zeros, jnp.zeros(v.shape, F32), jnp.zeros((1, 1), F32))
    dqs_t, dk_t, dv, dgamma = jax.lax.fori_loop(jnp.int32(0), jnp.int32(rows), body, init)
    dFk = jnp.where(_last_row_mask(dFk_ref.shape), gamma * dgamma, 0.0)

    @pl.when(j == 0)
    def _():
        for r in range(g):
            dq_ref[r] = dqs_t[r]
        dk_ref[...], dv_ref[...], dFk_ref[...] = dk_t, dv, dFk

    @pl.when(j > 0)
    def _():
        for r in range(g):
            dq_ref[r] += dqs_t[r]
        dk_ref[...] += dk_t
        dv_ref[...] += dv
        dFk_ref[...] += dFk

    @pl.when(j == n_steps - 1)
    def _():
        Z, dZ = Z_ref[...], dZ_ref[...]
        dk_t = dk_ref[...] + 2.0 * dot(k_t, dZ, EXACT)
        t_k = jnp.sum(dk_t * k_t, axis=1, keepdims=True) / DEG
        F_end_grad = _total(t_k) + gamma * _total(dZ * Z)
        dk = dk_t * fk
        dv = dv_ref[...]
        dFk = dFk_ref[...] - t_k + jnp.where(_last_row_mask(t_k.shape), F_end_grad, 0.0)
        for r in range(g):
            dden = dden_ref[r]
            dq_t = dq_ref[r] + 2.0 * dden * dot(qs_t[r], Z, EXACT)
            dq_i, dk_i, dv_i, dFq_i, dFk_i = intra_grads(
                qs[r], k, v, Fc, Fr, Rc, Rr, dnums[r], dden, ddenr_ref[r], scale, mm
            )
            dq_ref[r] = dq_t * fq + dq_i
            dFq_ref[r] = jnp.sum(dq_t * qs_t[r], axis=1, keepdims=True) / DEG + dFq_i
            dk, dv, dFk = dk + dk_i, dv + dv_i, dFk + dFk_i
        dk_ref[...], dv_ref[...], dFk_ref[...] = dk, dv, dFk


def chunk_grads(
    q,
    k,
    v,
    Fc,
    Fr,
    Rc,
    Rr,
    dnum,
    dden,
    dden_row,
    S_before,
    dS_after,
    Z_before,
    dZ_after,
    *,
    scale: float,
    backend: str,
    blocks: BlockSizes,
    mm: Matmul,
    interpret: bool,
):
    """Per-chunk gradients. q [B, H, g, Tp, d], k and v [B, H, Tp, d], Fc and Rc [B, H, N, c, 1], Fr and Rr
    [B, H, N, 1, c], dnum [B, H, g, Tp, e], dden [B, H, g, Tp, 1], dden_row [B, H, g, N, 1, c], S_before and
    dS_after [B, H, N, d, d, e] (mm.dtype), Z_before and dZ_after [B, H, N, d, d]. Returns float32 (dq
    [B, H, g, Tp, d], dk [B, H, Tp, d], dv [B, H, Tp, e], dF of the query rows [B, H, g, Tp, 1], dF of the key rows
    [B, H, Tp, 1])."""
    B, H, g, Tp, d = q.shape
    e = v.shape[-1]
    N, c = Fc.shape[2], Fc.shape[3]
    rows = blocks.rows(d)[1]
    per_chunk = lambda *tail: pl.BlockSpec((None, None, *tail), lambda b, h, n, j: (b, h, n) + (0,) * (len(tail) - 1))
    grouped = lambda *tail: pl.BlockSpec((None, None, g, *tail), lambda b, h, n, j: (b, h, 0, n, 0))
    state_rows = pl.BlockSpec((None, None, None, rows, d, e), lambda b, h, n, j: (b, h, n, j, 0, 0))
    whole_Z = pl.BlockSpec((None, None, None, d, d), lambda b, h, n, j: (b, h, n, 0, 0))
    column = pl.BlockSpec((None, None, None, c, 1), lambda b, h, n, j: (b, h, n, 0, 0))
    row = pl.BlockSpec((None, None, None, 1, c), lambda b, h, n, j: (b, h, n, 0, 0))
    in_specs = [
        grouped(c, d),
        per_chunk(c, d),
        per_chunk(c, e),
        column,
        row,
        column,
        row,
        grouped(c, e),
        grouped(c, 1),
        pl.BlockSpec((None, None, g, None, 1, c), lambda b, h, n, j: (b, h, 0, n, 0, 0)),
        state_rows,
        state_rows,
        whole_Z,
        whole_Z,
    ]
    out_specs = [grouped(c, d), per_chunk(c, d), per_chunk(c, e), grouped(c, 1), per_chunk(c, 1)]
    out_shape = [
        out_struct((B, H, g, Tp, d), F32, q),
        out_struct((B, H, Tp, d), F32, q),
        out_struct((B, H, Tp, e), F32, q),
        out_struct((B, H, g, Tp, 1), F32, q),
        out_struct((B, H, Tp, 1), F32, q),
    ]
    params = compiler_params(backend, blocks, ("parallel", "parallel", "parallel", "arbitrary"))
    return pl.pallas_call(
        partial(_kernel, scale=scale, mm=mm),
        grid=(B, H, N, d // rows),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=params,
        interpret=interpret,
    )(q, k, v, Fc, Fr, Rc, Rr, dnum, dden, dden_row, S_before, dS_after, Z_before, dZ_after)
