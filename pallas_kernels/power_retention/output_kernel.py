"""The output kernel: per chunk and query head, the intra-chunk power attention fused with the read of the
state carried into the chunk, normalised in place.

Grid (B, Hq, N, row blocks): every chunk is independent once the state pass has saved the boundary states, so the
chunk axis is parallel on both backends. The last axis walks the expanded state's rows a in blocks of `read_rows`
and accumulates phi(q~) S into the (resident) float32 output block; the last step adds the intra-chunk part and
the normaliser and divides. GPU: one row block (all d rows, looped inside the program, one [d, e] row at a time from
global memory); TPU: `read_rows` rows per grid step, so the VMEM block stays small at d = 128.
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.power_retention.chunk_math import F32, dot, gate_factors, intra, read_row
from pallas_kernels.power_retention.config import BlockSizes, compiler_params


def _kernel(q_ref, k_ref, v_ref, Gc_ref, Gr_ref, S_ref, Z_ref, y_ref, den_ref, *, scale, precision):
    """y [c, e] = (A v + phi(q~) S) / (A 1 + phi(q~) z) for one chunk of one query head; den [c, 1]."""
    j, n_steps = pl.program_id(3), pl.num_programs(3)
    rows = S_ref.shape[0]
    Gc, Gr = Gc_ref[...], Gr_ref[...]
    fq, _, _ = gate_factors(Gc, Gr, scale)
    q = q_ref[...].astype(F32)
    q_t = q * fq

    def body(i, acc):
        return acc + read_row(q_t, S_ref[i], j * rows + i, precision)

    part = jax.lax.fori_loop(jnp.int32(0), jnp.int32(rows), body, jnp.zeros(y_ref.shape, F32))

    @pl.when(j == 0)
    def _():
        y_ref[...] = part

    @pl.when(j > 0)
    def _():
        y_ref[...] += part

    @pl.when(j == n_steps - 1)
    def _():
        num, den = intra(q, k_ref[...].astype(F32), v_ref[...].astype(F32), Gc, Gr, scale, precision)
        den = den + jnp.sum(dot(q_t, Z_ref[...], precision) * q_t, axis=1, keepdims=True)
        num = num + y_ref[...]
        ok = den > 0
        y_ref[...] = jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)
        den_ref[...] = den


def output_chunks(
    q, k, v, Gc, Gr, S_before, Z_before, *, scale: float, backend: str, blocks: BlockSizes, precision, interpret: bool
):
    """Normalised output per chunk. q [B, Hq, Tp, d], k and v [B, H, Tp, d] (any float dtype), Gc [B, H, N, c, 1],
    Gr [B, H, N, 1, c], S_before [B, H, N, d, d, e], Z_before [B, H, N, d, d] (float32).
    Returns (y [B, Hq, Tp, e], den [B, Hq, Tp, 1]), float32."""
    B, Hq, Tp, d = q.shape
    H, e = k.shape[1], v.shape[-1]
    N, c = Gc.shape[2], Gc.shape[3]
    g = Hq // H
    rows = blocks.rows(d)[1]
    kv = lambda i: jax.lax.div(i, jnp.asarray(g, i.dtype))  # the kv-head of query head i (no floor_divide: TPU)
    in_specs = [
        pl.BlockSpec((None, None, c, d), lambda b, i, n, j: (b, i, n, 0)),
        pl.BlockSpec((None, None, c, d), lambda b, i, n, j: (b, kv(i), n, 0)),
        pl.BlockSpec((None, None, c, e), lambda b, i, n, j: (b, kv(i), n, 0)),
        pl.BlockSpec((None, None, None, c, 1), lambda b, i, n, j: (b, kv(i), n, 0, 0)),
        pl.BlockSpec((None, None, None, 1, c), lambda b, i, n, j: (b, kv(i), n, 0, 0)),
        pl.BlockSpec((None, None, None, rows, d, e), lambda b, i, n, j: (b, kv(i), n, j, 0, 0)),
        pl.BlockSpec((None, None, None, d, d), lambda b, i, n, j: (b, kv(i), n, 0, 0)),
    ]
    out_specs = [
        pl.BlockSpec((None, None, c, e), lambda b, i, n, j: (b, i, n, 0)),
        pl.BlockSpec((None, None, c, 1), lambda b, i, n, j: (b, i, n, 0)),
    ]
    params = compiler_params(backend, blocks, ("parallel", "parallel", "parallel", "arbitrary"))
    return pl.pallas_call(
        partial(_kernel, scale=scale, precision=precision),
        grid=(B, Hq, N, d // rows),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=(jax.ShapeDtypeStruct((B, Hq, Tp, e), F32), jax.ShapeDtypeStruct((B, Hq, Tp, 1), F32)),
        compiler_params=params,
        interpret=interpret,
    )(q, k, v, Gc, Gr, S_before, Z_before)
