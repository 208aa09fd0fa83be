"""The output kernel of chunked GLA: per chunk and query head, the intra-chunk part (intra.py, sub-chunk by
sub-chunk) plus the read of the state carried into the chunk, q~ S (q~ = 0 after the chunk's first reset).

Grid (B, Hq, N), every axis parallel: once the state pass has saved the boundary states, the chunks are
independent. Each program walks the chunk's n = c / s sub-chunks i (static loops, s = SUB_CHUNK), writing rows i
of the output from the diagonal pair (i, i), the earlier pairs (i, j < i) and the state read.
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.gated_linear_attention.intra import diagonal, off_diagonal
from pallas_kernels.power_retention.config import BlockSizes, compiler_params
from pallas_kernels.power_retention.kernel_math import F32, Matmul, dot
from pallas_kernels.vma import out_struct


def sub_chunks(ref, n: int, s: int, head=()) -> list:
    """The n sub-chunks of s rows of a chunk's [c, w] block `ref` (`head`: leading indices), as float32 values."""
    return [ref[(*head, pl.ds(i * s, s), slice(None))].astype(F32) for i in range(n)]


def _kernel(q_ref, k_ref, v_ref, F_ref, Rc_ref, Rr_ref, qg_ref, S_ref, o_ref, *, mm):
    """o [c, d_v] of one chunk and query head."""
    n, s = Rr_ref.shape[0], Rr_ref.shape[2]
    ks, vs, Fs, Rcs = (sub_chunks(ref, n, s) for ref in (k_ref, v_ref, F_ref, Rc_ref))
    S = S_ref[...]
    for i in range(n):
        rows = pl.ds(i * s, s)
        q_I = q_ref[rows, :].astype(F32)
        o = dot(qg_ref[rows, :], S, mm) + diagonal(q_I, ks[i], vs[i], Fs[i], Rcs[i])
        for j in range(i):
            o = o + off_diagonal(q_I, Fs[i], Rcs[i], ks[j], vs[j], Fs[j], Rr_ref[j], mm)
        o_ref[rows, :] = o


def output_chunks(q, k, v, F, Rc, Rr, q_gated, S_before, *, backend: str, blocks: BlockSizes, mm: Matmul, interpret):
    """Every chunk's outputs.

    Args:
        q: the scaled queries [B, Hq, Tp, d_k]; query head i reads kv-head i // (Hq // H).
        k: keys [B, H, Tp, d_k].
        v: values [B, H, Tp, d_v].
        F: cumulative log-gates per chunk [B, H, Tp, d_k] float32.
        Rc: reset counts per chunk [B, H, Tp, 1] float32.
        Rr: the same as rows per sub-chunk [B, H, N, n, 1, s].
        q_gated: q~ [B, Hq, Tp, d_k] float32.
        S_before: the state carried into each chunk [B, H, N, d_k, d_v] float32.
        backend: "gpu" or "tpu".
        blocks: Triton's warps and stages (GPU).
        mm: the matmuls' operand dtype and precision.
        interpret: run in interpret mode.

    Returns:
        o [B, Hq, Tp, d_v] float32.
    """
    B, Hq, Tp, d_k = q.shape
    H, d_v = k.shape[1], v.shape[-1]
    N, n, s = Rr.shape[2], Rr.shape[3], Rr.shape[5]
    c = n * s
    kv = lambda i: jax.lax.div(i, jnp.asarray(Hq // H, i.dtype))  # the kv-head of query head i (no floor_divide: TPU)
    query = lambda w: pl.BlockSpec((None, None, c, w), lambda b, i, t: (b, i, t, 0))
    key = lambda w: pl.BlockSpec((None, None, c, w), lambda b, i, t: (b, kv(i), t, 0))
    in_specs = [
        query(d_k),
        key(d_k),
        key(d_v),
        key(d_k),
        key(1),
        pl.BlockSpec((None, None, None, n, 1, s), lambda b, i, t: (b, kv(i), t, 0, 0, 0)),
        query(d_k),
        pl.BlockSpec((None, None, None, d_k, d_v), lambda b, i, t: (b, kv(i), t, 0, 0)),
    ]
    return pl.pallas_call(
        partial(_kernel, mm=mm),
        grid=(B, Hq, N),
        in_specs=in_specs,
        out_specs=query(d_v),
        out_shape=out_struct((B, Hq, Tp, d_v), F32, q),
        compiler_params=compiler_params(backend, blocks, ("parallel",) * 3),
        interpret=interpret,
    )(q, k, v, F, Rc, Rr, q_gated, S_before)
