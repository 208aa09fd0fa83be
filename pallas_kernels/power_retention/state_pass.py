"""The state pass: carry the expanded state across chunks and save it at every chunk boundary.

One kernel serves the forward and the backward (the factors and masks of kernel_math.Gates):
- forward: x = k, u = v, factor fk where `write`, chunks in order: S <- gamma S + phi(k~)^T v;
- backward: x = q (R = Hq/H query heads per kv-head), u = dnum, factor fq where `read`, chunks in reverse:
  dS <- gamma dS + sum over the R heads of phi(q~)^T dnum.
A token outside its mask writes nothing (x~ and u are selected to 0, so a NaN there stays out), and a chunk whose
`carry` is off drops the state instead of scaling it by 0. Outputs `before` [B, H, N, d, d, e] (the state just
before each chunk is processed: the forward state carried into chunk n, or the backward gradient of the state
carried out of chunk n) in the matmul operand dtype (bf16 for bf16 inputs: the output and gradient kernels read
it only as a bf16 matmul operand, so storing it in float32 would double its bytes for nothing) and `final`
[B, H, d, d, e] in float32.

Parallelism and memory. The chunk axis is sequential; the programs split the state's d rows a into blocks of
`state_rows` ([rows, d, e] each), which are independent (row a only needs column a of x~), and run over (B, H,
row blocks).
- TPU: grid (B, H, row blocks, N) with the chunk axis last ("arbitrary"), the running block in a VMEM scratch
  (accumulator pattern); the pipeline streams x, u and the boundary blocks.
- GPU (Triton): grid (B, H, row blocks), each program loops over the N chunks with its rows in registers
  (rows * d * e * 4 bytes <= 64 KiB by default: 4 rows at d = 64, so B * H * 16 programs) and stores each boundary.
Saving every boundary costs N * d * d * e bytes per head times the operand size (512 KiB per chunk at d = 64 in
bf16, 1 MiB in float32); it lets the output and gradient kernels run fully parallel over chunks, and the backward
reuses these states instead of recomputing them (the package docstring counts the bytes and FLOPs of each pass).
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.power_retention.config import BlockSizes, compiler_params
from pallas_kernels.power_retention.kernel_math import F32, Matmul, write_row
from pallas_kernels.vma import out_struct


def _advance(rows, a0, gamma, carry, xs_t, us, mm: Matmul):
    """gamma * rows[i] (dropped where not `carry`) + sum_r write_row(x~_r, u_r, a0 + i) for each row i: the
    shared per-chunk update."""
    out = []
    for i, S_a in enumerate(rows):
        inc = write_row(xs_t[0], us[0], a0 + i, mm)
        for x_t, u in zip(xs_t[1:], us[1:]):
            inc = inc + write_row(x_t, u, a0 + i, mm)
        out.append(jnp.where(carry > 0, gamma * S_a, 0.0) + inc)
    return out


def _masked(x_ref, u_ref, f, keep, idx):
    """The R pairs (x~_r, u_r) of one chunk: x * f and u where `keep` (> 0), else 0 (float32)."""
    on = keep > 0
    xs_t = [jnp.where(on, x_ref[(r, *idx)].astype(F32) * f, 0.0) for r in range(x_ref.shape[0])]
    us = [jnp.where(on, u_ref[(r, *idx)].astype(F32), 0.0) for r in range(u_ref.shape[0])]
    return xs_t, us


def _tpu_kernel(x_ref, u_ref, f_ref, keep_ref, gamma_ref, carry_ref, init_ref, before_ref, final_ref, acc_ref, *, mm):
    """One (b, h, row block, chunk) step: save the running rows, then advance them by one chunk."""
    t, n_chunks = pl.program_id(3), pl.num_programs(3)
    rows = acc_ref.shape[0]

    @pl.when(t == 0)
    def _():
        acc_ref[...] = init_ref[...]

    before_ref[...] = acc_ref[...].astype(before_ref.dtype)
    xs_t, us = _masked(x_ref, u_ref, f_ref[...], keep_ref[...], (Ellipsis,))
    rows_in = [acc_ref[i] for i in range(rows)]
    new = _advance(rows_in, pl.program_id(2) * rows, gamma_ref[...], carry_ref[...], xs_t, us, mm)
    for i, S_a in enumerate(new):
        acc_ref[i] = S_a

    @pl.when(t == n_chunks - 1)
    def _():
        final_ref[...] = acc_ref[...]


def _gpu_kernel(
    x_ref, u_ref, f_ref, keep_ref, gamma_ref, carry_ref, init_ref, before_ref, final_ref, *, chunk, reverse, mm
):
    """One (b, h, row block) program: loop over all chunks with the rows in registers, storing each boundary."""
    rows = init_ref.shape[0]
    n_chunks = before_ref.shape[0]
    a0 = pl.program_id(2) * rows

    def body(t, state):
        n = n_chunks - 1 - t if reverse else t
        for i, S_a in enumerate(state):
            before_ref[n, i] = S_a.astype(before_ref.dtype)
        span = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        xs_t, us = _masked(x_ref, u_ref, f_ref[span, :], keep_ref[span, :], (span, slice(None)))
        return tuple(_advance(list(state), a0, gamma_ref[n], carry_ref[n], xs_t, us, mm))

    state = jax.lax.fori_loop(jnp.int32(0), jnp.int32(n_chunks), body, tuple(init_ref[i] for i in range(rows)))
    for i, S_a in enumerate(state):
        final_ref[i] = S_a


def state_pass(
    x,
    u,
    f,
    keep,
    gamma,
    carry,
    init,
    *,
    chunk: int,
    reverse: bool,
    backend: str,
    blocks: BlockSizes,
    mm: Matmul,
    interpret: bool,
):
    """Boundary states of S <- gamma_n S + sum_r phi(x~_r)^T u_r over chunks n (in order, or reversed), with
    x~ = x f and u where `keep` > 0 (else 0), and gamma_n S dropped where `carry` is 0.

    x [B, H, R, Tp, d], u [B, H, R, Tp, e] (any float dtype), f and keep [B, H, Tp, 1], gamma and carry
    [B, H, N, 1, 1] float32, init [B, H, d, d, e] float32. Returns (before [B, H, N, d, d, e] in mm.dtype,
    final [B, H, d, d, e] float32).
    """
    B, H, R, Tp, d = x.shape
    e = u.shape[-1]
    N = Tp // chunk
    rows, _ = blocks.rows(d)
    out_shape = (out_struct((B, H, N, d, d, e), mm.dtype, x), out_struct((B, H, d, d, e), F32, x))
    args = (x, u, f, keep, gamma, carry, init)
    if backend == "tpu":
        nth = (lambda t: N - 1 - t) if reverse else (lambda t: t)
        per_token = lambda width: pl.BlockSpec((None, None, R, chunk, width), lambda b, h, j, t: (b, h, 0, nth(t), 0))
        token_col = pl.BlockSpec((None, None, chunk, 1), lambda b, h, j, t: (b, h, nth(t), 0))
        chunk_one = pl.BlockSpec((None, None, None, 1, 1), lambda b, h, j, t: (b, h, nth(t), 0, 0))
        in_specs = [
            per_token(d),
            per_token(e),
            token_col,
            token_col,
            chunk_one,
            chunk_one,
            pl.BlockSpec((None, None, rows, d, e), lambda b, h, j, t: (b, h, j, 0, 0)),
        ]
        out_specs = [
            pl.BlockSpec((None, None, None, rows, d, e), lambda b, h, j, t: (b, h, nth(t), j, 0, 0)),
            pl.BlockSpec((None, None, rows, d, e), lambda b, h, j, t: (b, h, j, 0, 0)),
        ]
        return pl.pallas_call(
            partial(_tpu_kernel, mm=mm),
            grid=(B, H, d // rows, N),
            in_specs=in_specs,
            out_specs=out_specs,
            out_shape=out_shape,
            scratch_shapes=[pltpu.VMEM((rows, d, e), F32)],
            compiler_params=compiler_params(backend, blocks, ("parallel", "parallel", "parallel", "arbitrary")),
            interpret=interpret,
        )(*args)
    whole = lambda *tail: pl.BlockSpec((None, None, *tail), lambda b, h, j: (b, h) + (0,) * len(tail))
    in_specs = [
        whole(R, Tp, d),
        whole(R, Tp, e),
        whole(Tp, 1),
        whole(Tp, 1),
        whole(N, 1, 1),
        whole(N, 1, 1),
        pl.BlockSpec((None, None, rows, d, e), lambda b, h, j: (b, h, j, 0, 0)),
    ]
    out_specs = [
        pl.BlockSpec((None, None, N, rows, d, e), lambda b, h, j: (b, h, 0, j, 0, 0)),
        pl.BlockSpec((None, None, rows, d, e), lambda b, h, j: (b, h, j, 0, 0)),
    ]
    return pl.pallas_call(
        partial(_gpu_kernel, chunk=chunk, reverse=reverse, mm=mm),
        grid=(B, H, d // rows),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=compiler_params(backend, blocks, ()),
        interpret=interpret,
    )(*args)
