"""The output kernel: per chunk and query head, the intra-chunk power attention fused with the read of the
state carried into the chunk, normalised in place.

Grid (B, Hq, N, row blocks): every chunk is independent once the state pass has saved the boundary states, so the
chunk axis is parallel on both backends. The last axis walks the expanded state's rows a in blocks of `read_rows`
and accumulates phi(q~) S into the (resident) float32 output block; the last step selects the read where the query
reads the carried state (R_i == 0), adds the intra-chunk part and the normaliser and divides. GPU: one row block
(all d rows, looped inside the program, one [d, e] row at a time from global memory); TPU: `read_rows` rows per
grid step, so the VMEM block stays small at d = 128.
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.power_retention.config import BlockSizes, compiler_params
from pallas_kernels.power_retention.kernel_math import F32, Matmul, dot, gates, intra, normalise, read_row, scaled
from pallas_kernels.vma import out_struct


def _kernel(q_ref, k_ref, v_ref, Fc_ref, Fr_ref, Rc_ref, Rr_ref, S_ref, Z_ref, y_ref, den_ref, *, scale, mm):
    """y [c, e] = (A v + phi(q~) S) / (A 1 + phi(q~) z) for one chunk of one query head; den [c, 1]."""
    j, n_steps = pl.program_id(3), pl.num_programs(3)
    rows = S_ref.shape[0]
    Fc, Fr, Rc, Rr = Fc_ref[...], Fr_ref[...], Rc_ref[...], Rr_ref[...]
    g = gates(Fc, Fr, Rc, Rr, scale)
    q = q_ref[...].astype(F32)
    q_t = scaled(q, g.fq, g.read)

    def body(i, acc):
        return acc + read_row(q_t, S_ref[i], j * rows + i, mm)

    part = jax.lax.fori_loop(jnp.int32(0), jnp.int32(rows), body, jnp.zeros(y_ref.shape, F32))

    @pl.when(j == 0)
    def _():
        y_ref[...] = part

    @pl.when(j > 0)
    def _():
        y_ref[...] += part

    @pl.when(j == n_steps - 1)
    def _():
        num, den = intra(q, k_ref[...].astype(F32), v_ref[...].astype(F32), Fc, Fr, Rc, Rr, scale, mm)
        read_den = jnp.sum(dot(q_t, Z_ref[...], Matmul(F32, jax.lax.Precision.HIGHEST)) * q_t, axis=1, keepdims=True)
        den = den + jnp.where(g.read, read_den, 0.0)
        num = num + jnp.where(g.read, y_ref[...], 0.0)
        y_ref[...] = normalise(num, den)
        den_ref[...] = den


def output_chunks(
    q,
    k,
    v,
    Fc,
    Fr,
    Rc,
    Rr,
    S_before,
    Z_before,
    *,
    scale: float,
    backend: str,
    blocks: BlockSizes,
    mm: Matmul,
    interpret: bool,
):
    """Normalised output per chunk. q [B, Hq, Tp, d], k and v [B, H, Tp, d] (any float dtype), Fc and Rc
    [B, H, N, c, 1], Fr and Rr [B, H, N, 1, c], S_before [B, H, N, d, d, e] (mm.dtype), Z_before [B, H, N, d, d]
    (float32). Returns (y [B, Hq, Tp, e], den [B, Hq, Tp, 1]), float32."""
    B, Hq, Tp, d = q.shape
    H, e = k.shape[1], v.shape[-1]
    N, c = Fc.shape[2], Fc.shape[3]
    g = Hq // H
    rows = blocks.rows(d)[1]
    kv = lambda i: jax.lax.div(i, jnp.asarray(g, i.dtype))  # the kv-head of query head i (no floor_divide: TPU)
    column = pl.BlockSpec((None, None, None, c, 1), lambda b, i, n, j: (b, kv(i), n, 0, 0))
    row = pl.BlockSpec((None, None, None, 1, c), lambda b, i, n, j: (b, kv(i), n, 0, 0))
    in_specs = [
        pl.BlockSpec((None, None, c, d), lambda b, i, n, j: (b, i, n, 0)),
        pl.BlockSpec((None, None, c, d), lambda b, i, n, j: (b, kv(i), n, 0)),
        pl.BlockSpec((None, None, c, e), lambda b, i, n, j: (b, kv(i), n, 0)),
        column,
        row,
        column,
        row,
        pl.BlockSpec((None, None, None, rows, d, e), lambda b, i, n, j: (b, kv(i), n, j, 0, 0)),
        pl.BlockSpec((None, None, None, d, d), lambda b, i, n, j: (b, kv(i), n, 0, 0)),
    ]
    out_specs = [
        pl.BlockSpec((None, None, c, e), lambda b, i, n, j: (b, i, n, 0)),
        pl.BlockSpec((None, None, c, 1), lambda b, i, n, j: (b, i, n, 0)),
    ]
    params = compiler_params(backend, blocks, ("parallel", "parallel", "parallel", "arbitrary"))
    return pl.pallas_call(
        partial(_kernel, scale=scale, mm=mm),
        grid=(B, Hq, N, d // rows),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=(out_struct((B, Hq, Tp, e), F32, q), out_struct((B, Hq, Tp, 1), F32, q)),
        compiler_params=params,
        interpret=interpret,
    )(q, k, v, Fc, Fr, Rc, Rr, S_before, Z_before)
