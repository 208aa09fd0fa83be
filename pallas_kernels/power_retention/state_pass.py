"""The state pass: carry the expanded state across chunks and save it at every chunk boundary.

One kernel serves the forward and the backward:
- forward: x = k, u = v, factor exp((G_end - G)/2), chunks in order: S <- gamma S + phi(k~)^T v;
- backward: x = q (R = Hq/H query heads per kv-head), u = dnum, factor scale exp(G/2), chunks in reverse:
  dS <- gamma dS + sum over the R heads of phi(q~)^T dnum.
Outputs `before` [B, H, N, d, d, e] (the state just before each chunk is processed: the forward state carried into
chunk n, or the backward gradient of the state carried out of chunk n) and `final` [B, H, d, d, e].

Parallelism and memory. The chunk axis is sequential; the programs split the state's d rows a into blocks of
`state_rows` ([rows, d, e] each), which are independent (row a only needs column a of x~), and run over (B, H,
row blocks).
- TPU: grid (B, H, row blocks, N) with the chunk axis last ("arbitrary"), the running block in a VMEM scratch
  (accumulator pattern); the pipeline streams x, u and the boundary blocks.
- GPU (Triton): grid (B, H, row blocks), each program loops over the N chunks with its rows in registers
  (rows * d * e * 4 bytes <= 64 KiB by default: 4 rows at d = 64, so B * H * 16 programs) and stores each boundary.
Saving every boundary costs N * d * d * e * 4 bytes per head (1 MiB per chunk at d = 64); it lets the output and
gradient kernels run fully parallel over chunks, and the backward reuses these states instead of recomputing them.
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.power_retention.chunk_math import F32, write_row
from pallas_kernels.power_retention.config import BlockSizes, compiler_params


def _advance(rows, a0, gamma, xs_t, us, precision):
    """gamma * rows[i] + sum_r write_row(x~_r, u_r, a0 + i) for each row i: the shared per-chunk update."""
    out = []
    for i, S_a in enumerate(rows):
        inc = write_row(xs_t[0], us[0], a0 + i, precision)
        for x_t, u in zip(xs_t[1:], us[1:]):
            inc = inc + write_row(x_t, u, a0 + i, precision)
        out.append(gamma * S_a + inc)
    return out


def _tpu_kernel(x_ref, u_ref, f_ref, gamma_ref, init_ref, before_ref, final_ref, acc_ref, *, precision):
    """One (b, h, row block, chunk) step: save the running rows, then advance them by one chunk."""
    t, n_chunks = pl.program_id(3), pl.num_programs(3)
    rows = acc_ref.shape[0]

    @pl.when(t == 0)
    def _():
        acc_ref[...] = init_ref[...]

    before_ref[...] = acc_ref[...]
    f = f_ref[...]
    xs_t = [x_ref[r].astype(F32) * f for r in range(x_ref.shape[0])]
    us = [u_ref[r].astype(F32) for r in range(u_ref.shape[0])]
    new = _advance([acc_ref[i] for i in range(rows)], pl.program_id(2) * rows, gamma_ref[...], xs_t, us, precision)
    for i, S_a in enumerate(new):
        acc_ref[i] = S_a

    @pl.when(t == n_chunks - 1)
    def _():
        final_ref[...] = acc_ref[...]


def _gpu_kernel(x_ref, u_ref, f_ref, gamma_ref, init_ref, before_ref, final_ref, *, chunk, reverse, precision):
    """One (b, h, row block) program: loop over all chunks with the rows in registers, storing each boundary."""
    rows = init_ref.shape[0]
    n_chunks = before_ref.shape[0]
    a0 = pl.program_id(2) * rows

    def body(t, carry):
        n = n_chunks - 1 - t if reverse else t
        for i, S_a in enumerate(carry):
            before_ref[n, i] = S_a
        span = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        f = f_ref[span, :]
        xs_t = [x_ref[r, span, :].astype(F32) * f for r in range(x_ref.shape[0])]
        us = [u_ref[r, span, :].astype(F32) for r in range(u_ref.shape[0])]
        return tuple(_advance(list(carry), a0, gamma_ref[n], xs_t, us, precision))

    carry = jax.lax.fori_loop(jnp.int32(0), jnp.int32(n_chunks), body, tuple(init_ref[i] for i in range(rows)))
    for i, S_a in enumerate(carry):
        final_ref[i] = S_a


def state_pass(
    x, u, f, gamma, init, *, chunk: int, reverse: bool, backend: str, blocks: BlockSizes, precision, interpret: bool
):
    """Boundary states of S <- gamma_n S + sum_r phi(x_r f)^T u_r over chunks n (in order, or reversed).

    x [B, H, R, Tp, d], u [B, H, R, Tp, e] (any float dtype), f [B, H, Tp, 1] and gamma [B, H, N, 1, 1] float32,
    init [B, H, d, d, e] float32. Returns (before [B, H, N, d, d, e], final [B, H, d, d, e]), float32.
    """
    B, H, R, Tp, d = x.shape
    e = u.shape[-1]
    N = Tp // chunk
    rows, _ = blocks.rows(d)
    out_shape = (jax.ShapeDtypeStruct((B, H, N, d, d, e), F32), jax.ShapeDtypeStruct((B, H, d, d, e), F32))
    if backend == "tpu":
        nth = (lambda t: N - 1 - t) if reverse else (lambda t: t)
        in_specs = [
            pl.BlockSpec((None, None, R, chunk, d), lambda b, h, j, t: (b, h, 0, nth(t), 0)),
            pl.BlockSpec((None, None, R, chunk, e), lambda b, h, j, t: (b, h, 0, nth(t), 0)),
            pl.BlockSpec((None, None, chunk, 1), lambda b, h, j, t: (b, h, nth(t), 0)),
            pl.BlockSpec((None, None, None, 1, 1), lambda b, h, j, t: (b, h, nth(t), 0, 0)),
            pl.BlockSpec((None, None, rows, d, e), lambda b, h, j, t: (b, h, j, 0, 0)),
        ]
        out_specs = [
            pl.BlockSpec((None, None, None, rows, d, e), lambda b, h, j, t: (b, h, nth(t), j, 0, 0)),
            pl.BlockSpec((None, None, rows, d, e), lambda b, h, j, t: (b, h, j, 0, 0)),
        ]
        return pl.pallas_call(
            partial(_tpu_kernel, precision=precision),
            grid=(B, H, d // rows, N),
            in_specs=in_specs,
            out_specs=out_specs,
            out_shape=out_shape,
            scratch_shapes=[pltpu.VMEM((rows, d, e), F32)],
            compiler_params=compiler_params(backend, blocks, ("parallel", "parallel", "parallel", "arbitrary")),
            interpret=interpret,
        )(x, u, f, gamma, init)
    in_specs = [
        pl.BlockSpec((None, None, R, Tp, d), lambda b, h, j: (b, h, 0, 0, 0)),
        pl.BlockSpec((None, None, R, Tp, e), lambda b, h, j: (b, h, 0, 0, 0)),
        pl.BlockSpec((None, None, Tp, 1), lambda b, h, j: (b, h, 0, 0)),
        pl.BlockSpec((None, None, N, 1, 1), lambda b, h, j: (b, h, 0, 0, 0)),
        pl.BlockSpec((None, None, rows, d, e), lambda b, h, j: (b, h, j, 0, 0)),
    ]
    out_specs = [
        pl.BlockSpec((None, None, N, rows, d, e), lambda b, h, j: (b, h, 0, j, 0, 0)),
        pl.BlockSpec((None, None, rows, d, e), lambda b, h, j: (b, h, j, 0, 0)),
    ]
    return pl.pallas_call(
        partial(_gpu_kernel, chunk=chunk, reverse=reverse, precision=precision),
        grid=(B, H, d // rows),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=compiler_params(backend, blocks, ()),
        interpret=interpret,
    )(x, u, f, gamma, init)
