"""The gradient kernel: dq, dk, dv and dG of one chunk and kv-head from the saved boundary states.

Inputs per chunk n: the forward state carried in (S_before, Z_before) and the gradient of the state carried out
(dS_after, dZ_after, from the reverse state pass), plus dnum = dy / den and dden = -(dy . y) / den. Row a of the
expanded state gives: dq~ (read), dk~ and dv (write) and <dS_after, S_before> (the chunk decay's gradient); the last
grid step adds the z terms, the gate-factor chain rule (q~ = q scale exp(G/2), k~ = k exp((G_end - G)/2),
gamma = exp(G_end)) and the intra-chunk gradients. Grid (B, H, N, row blocks) as in `output_kernel.py`: chunks in
parallel, the row blocks a reduction into resident float32 output blocks. The g = Hq / H query heads of a kv-head
are handled in one program (static loop), since they share dk and dv.
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.power_retention.chunk_math import DEG, F32, dot, gate_factors, intra_grads, read_row, read_row_grad
from pallas_kernels.power_retention.config import BlockSizes, compiler_params


def _last_row_mask(shape):
    return jax.lax.broadcasted_iota(jnp.int32, shape, 0) == shape[0] - 1


def _total(x):
    """Sum of a 2-d array as [1, 1]."""
    return jnp.sum(jnp.sum(x, axis=1, keepdims=True), axis=0, keepdims=True)


def _kernel(
    q_ref,
    k_ref,
    v_ref,
    Gc_ref,
    Gr_ref,
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
    dGq_ref,
    dGk_ref,
    *,
    scale,
    precision,
):
    """Accumulate the state rows' gradients; on the last step finish dq, dk, dv, dGq, dGk for the chunk."""
    j, n_steps = pl.program_id(3), pl.num_programs(3)
    rows, g = S_ref.shape[0], q_ref.shape[0]
    Gc, Gr = Gc_ref[...], Gr_ref[...]
    fq, fk, gamma = gate_factors(Gc, Gr, scale)
    k, v = k_ref[...].astype(F32), v_ref[...].astype(F32)
    k_t = k * fk
    qs = [q_ref[r].astype(F32) for r in range(g)]
    qs_t = [q * fq for q in qs]
    dnums = [dnum_ref[r] for r in range(g)]

    def body(i, carry):
        dqs_t, dk_t, dv, dgamma = carry
        a = j * rows + i
        S_a, dS_a = S_ref[i], dS_ref[i]
        dqs_t = tuple(dq + read_row_grad(q_t, dn, S_a, a, precision) for dq, q_t, dn in zip(dqs_t, qs_t, dnums))
        dk_t = dk_t + read_row_grad(k_t, v, dS_a, a, precision)
        dv = dv + read_row(k_t, dS_a, a, precision)
        return dqs_t, dk_t, dv, dgamma + _total(dS_a * S_a)

    zeros = jnp.zeros(k.shape, F32)
    init = (tuple(zeros for _ in range(g)), zeros, jnp.zeros(v.shape, F32), jnp.zeros((1, 1), F32))
    dqs_t, dk_t, dv, dgamma = jax.lax.fori_loop(jnp.int32(0), jnp.int32(rows), body, init)
    dGk = jnp.where(_last_row_mask(dGk_ref.shape), gamma * dgamma, 0.0)

    @pl.when(j == 0)
    def _():
        for r in range(g):
            dq_ref[r] = dqs_t[r]
        dk_ref[...], dv_ref[...], dGk_ref[...] = dk_t, dv, dGk

    @pl.when(j > 0)
    def _():
        for r in range(g):
            dq_ref[r] += dqs_t[r]
        dk_ref[...] += dk_t
        dv_ref[...] += dv
        dGk_ref[...] += dGk

    @pl.when(j == n_steps - 1)
    def _():
        Z, dZ = Z_ref[...], dZ_ref[...]
        dk_t = dk_ref[...] + 2.0 * dot(k_t, dZ, precision)
        t_k = jnp.sum(dk_t * k_t, axis=1, keepdims=True) / DEG
        G_end_grad = _total(t_k) + gamma * _total(dZ * Z)
        dk = dk_t * fk
        dv = dv_ref[...]
        dGk = dGk_ref[...] - t_k + jnp.where(_last_row_mask(t_k.shape), G_end_grad, 0.0)
        for r in range(g):
            dden = dden_ref[r]
            dq_t = dq_ref[r] + 2.0 * dden * dot(qs_t[r], Z, precision)
            dq_i, dk_i, dv_i, dGq_i, dGk_i = intra_grads(
                qs[r], k, v, Gc, Gr, dnums[r], dden, ddenr_ref[r], scale, precision
            )
            dq_ref[r] = dq_t * fq + dq_i
            dGq_ref[r] = jnp.sum(dq_t * qs_t[r], axis=1, keepdims=True) / DEG + dGq_i
            dk, dv, dGk = dk + dk_i, dv + dv_i, dGk + dGk_i
        dk_ref[...], dv_ref[...], dGk_ref[...] = dk, dv, dGk


def chunk_grads(
    q,
    k,
    v,
    Gc,
    Gr,
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
    precision,
    interpret: bool,
):
    """Per-chunk gradients. q [B, H, g, Tp, d], k and v [B, H, Tp, d], Gc [B, H, N, c, 1], Gr [B, H, N, 1, c],
    dnum [B, H, g, Tp, e], dden [B, H, g, Tp, 1], dden_row [B, H, g, N, 1, c], S_before and dS_after
    [B, H, N, d, d, e], Z_before and dZ_after [B, H, N, d, d]. Returns float32 (dq [B, H, g, Tp, d],
    dk [B, H, Tp, d], dv [B, H, Tp, e], dG of the query rows [B, H, g, Tp, 1], dG of the key rows [B, H, Tp, 1])."""
    B, H, g, Tp, d = q.shape
    e = v.shape[-1]
    N, c = Gc.shape[2], Gc.shape[3]
    rows = blocks.rows(d)[1]
    per_chunk = lambda *tail: pl.BlockSpec((None, None, *tail), lambda b, h, n, j: (b, h, n) + (0,) * (len(tail) - 1))
    grouped = lambda *tail: pl.BlockSpec((None, None, g, *tail), lambda b, h, n, j: (b, h, 0, n, 0))
    state_rows = pl.BlockSpec((None, None, None, rows, d, e), lambda b, h, n, j: (b, h, n, j, 0, 0))
    whole_Z = pl.BlockSpec((None, None, None, d, d), lambda b, h, n, j: (b, h, n, 0, 0))
    in_specs = [
        grouped(c, d),
        per_chunk(c, d),
        per_chunk(c, e),
        pl.BlockSpec((None, None, None, c, 1), lambda b, h, n, j: (b, h, n, 0, 0)),
        pl.BlockSpec((None, None, None, 1, c), lambda b, h, n, j: (b, h, n, 0, 0)),
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
        jax.ShapeDtypeStruct((B, H, g, Tp, d), F32),
        jax.ShapeDtypeStruct((B, H, Tp, d), F32),
        jax.ShapeDtypeStruct((B, H, Tp, e), F32),
        jax.ShapeDtypeStruct((B, H, g, Tp, 1), F32),
        jax.ShapeDtypeStruct((B, H, Tp, 1), F32),
    ]
    params = compiler_params(backend, blocks, ("parallel", "parallel", "parallel", "arbitrary"))
    return pl.pallas_call(
        partial(_kernel, scale=scale, precision=precision),
        grid=(B, H, N, d // rows),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=params,
        interpret=interpret,
    )(q, k, v, Gc, Gr, dnum, dden, dden_row, S_before, dS_after, Z_before, dZ_after)
