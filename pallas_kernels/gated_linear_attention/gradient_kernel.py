"""The gradient kernel of chunked GLA: one chunk of one kv-head (its g query heads in a static loop, since they
share dk and dv) from the saved boundary states.

Per chunk, with S the state carried in, dS the gradient of the state carried out (the reverse state pass) and dO
the output's cotangent rows:
- the state read o += q~ S gives dq~ = dO S^T;
- the state write S_out = gamma S + k~^T v gives dk~ = v dS^T and dv = k~ dS;
- the intra-chunk part gives dq, dk, dv by intra.py's pair gradients.
dq~ and dk~ come back apart from the intra dq and dk: the caller's XLA takes them through the gate factors (the
chain rule to q, k and F; vjp.py). Grid (B, H, N), every axis parallel; sub-chunks in static loops as in
output_kernel.py, each key sub-chunk's gradients accumulated as values and stored once.
"""

from functools import partial

from jax.experimental import pallas as pl

from pallas_kernels.gated_linear_attention.intra import diagonal_grads, off_diagonal_grads
from pallas_kernels.gated_linear_attention.output_kernel import sub_chunks
from pallas_kernels.power_retention.config import BlockSizes, compiler_params
from pallas_kernels.power_retention.kernel_math import F32, Matmul, dot
from pallas_kernels.vma import out_struct


def _kernel(
    q_ref,
    k_ref,
    v_ref,
    F_ref,
    Rc_ref,
    Rr_ref,
    do_ref,
    kg_ref,
    S_ref,
    dS_ref,
    dq_ref,
    dqg_ref,
    dk_ref,
    dkg_ref,
    dv_ref,
    *,
    mm,
):
    """dq, dq~ [g, c, d_k], dk, dk~ [c, d_k] and dv [c, d_v] of one chunk and kv-head."""
    n, s, g = Rr_ref.shape[0], Rr_ref.shape[2], q_ref.shape[0]
    ks, vs, Fs, Rcs, kgs = (sub_chunks(ref, n, s) for ref in (k_ref, v_ref, F_ref, Rc_ref, kg_ref))
    S, dS = S_ref[...], dS_ref[...]
    dks = [None] * n
    dvs = [dot(kgs[j], dS, mm) for j in range(n)]
    for r in range(g):
        qs, dos = sub_chunks(q_ref, n, s, (r,)), sub_chunks(do_ref, n, s, (r,))
        for i in range(n):
            rows = pl.ds(i * s, s)
            dqg_ref[r, rows, :] = dot(dos[i], S, mm, trans_y=True)
            dq, dk, dv = diagonal_grads(qs[i], ks[i], vs[i], Fs[i], Rcs[i], dos[i])
            dks[i] = dk if dks[i] is None else dks[i] + dk
            dvs[i] = dvs[i] + dv
            for j in range(i):
                dq_j, dk, dv = off_diagonal_grads(qs[i], Fs[i], Rcs[i], ks[j], vs[j], Fs[j], Rr_ref[j], dos[i], mm)
                dq, dks[j], dvs[j] = dq + dq_j, dks[j] + dk, dvs[j] + dv
            dq_ref[r, rows, :] = dq
    for j in range(n):
        rows = pl.ds(j * s, s)
        dk_ref[rows, :] = dks[j]
        dkg_ref[rows, :] = dot(vs[j], dS, mm, trans_y=True)
        dv_ref[rows, :] = dvs[j]


def chunk_grads(
    q, k, v, F, Rc, Rr, do, k_gated, S_before, dS_after, *, backend: str, blocks: BlockSizes, mm: Matmul, interpret
):
    """Every chunk's gradients.

    Args:
        q: the scaled queries [B, H, g, Tp, d_k].
        k: keys [B, H, Tp, d_k].
        v: values [B, H, Tp, d_v].
        F: cumulative log-gates per chunk [B, H, Tp, d_k] float32.
        Rc: reset counts per chunk [B, H, Tp, 1] float32.
        Rr: the same as rows per sub-chunk [B, H, N, n, 1, s].
        do: the output's cotangent [B, H, g, Tp, d_v] float32.
        k_gated: k~ [B, H, Tp, d_k] float32.
        S_before: the state carried into each chunk [B, H, N, d_k, d_v] float32.
        dS_after: the gradient of the state carried out of each chunk [B, H, N, d_k, d_v] float32.
        backend: "gpu" or "tpu".
        blocks: Triton's warps and stages (GPU).
        mm: the matmuls' operand dtype and precision.
        interpret: run in interpret mode.

    Returns:
        (dq [B, H, g, Tp, d_k] (intra-chunk), dq~ [B, H, g, Tp, d_k], dk [B, H, Tp, d_k] (intra-chunk),
            dk~ [B, H, Tp, d_k], dv [B, H, Tp, d_v]), float32.
    """
    B, H, g, Tp, d_k = q.shape
    d_v = v.shape[-1]
    N, n, s = Rr.shape[2], Rr.shape[3], Rr.shape[5]
    c = n * s
    grouped = lambda w: pl.BlockSpec((None, None, g, c, w), lambda b, h, t: (b, h, 0, t, 0))
    token = lambda w: pl.BlockSpec((None, None, c, w), lambda b, h, t: (b, h, t, 0))
    state = pl.BlockSpec((None, None, None, d_k, d_v), lambda b, h, t: (b, h, t, 0, 0))
    in_specs = [
        grouped(d_k),
        token(d_k),
        token(d_v),
        token(d_k),
        token(1),
        pl.BlockSpec((None, None, None, n, 1, s), lambda b, h, t: (b, h, t, 0, 0, 0)),
        grouped(d_v),
        token(d_k),
        state,
        state,
    ]
    out = lambda *shape: out_struct(shape, F32, q)
    return pl.pallas_call(
        partial(_kernel, mm=mm),
        grid=(B, H, N),
        in_specs=in_specs,
        out_specs=[grouped(d_k), grouped(d_k), token(d_k), token(d_k), token(d_v)],
        out_shape=[
            out(B, H, g, Tp, d_k),
            out(B, H, g, Tp, d_k),
            out(B, H, Tp, d_k),
            out(B, H, Tp, d_k),
            out(B, H, Tp, d_v),
        ],
        compiler_params=compiler_params(backend, blocks, ("parallel",) * 3),
        interpret=interpret,
    )(q, k, v, F, Rc, Rr, do, k_gated, S_before, dS_after)
