"""The state pass of chunked GLA: carry the [d_k, d_v] state across chunks and save it at every chunk boundary.

One kernel serves the forward and the backward, S <- gamma_n * S + sum_r x_r^T u_r per chunk n, gamma_n [d_k, 1]
the chunk's decay per key row (a row whose gamma is 0, a reset or an underflow, is dropped outright, NaN
included, as the XLA path's `decay_state` does):
- forward: x = k~ (the keys times their factor to the chunk's end, 0 outside the chunk's last document), u = v,
  chunks in order;
- backward: x = q~ (the g query heads' queries times their factor, 0 after the chunk's first reset), u = dO,
  chunks in reverse: the state's gradient.
Outputs `before` [B, H, N, d_k, d_v] (the state just before each chunk is processed) and `final` [B, H, d_k, d_v],
both float32 (the output and gradient kernels read `before` as a matmul operand).
Parallel over (B, H); the chunk axis is sequential. TPU: grid (B, H, N), the chunk axis last ("arbitrary") with the
running state in a VMEM scratch. GPU (Triton): grid (B, H), each program loops over the N chunks with the state in
registers (d_k * d_v * 4 bytes: 16 KiB at 64 x 64).
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.power_retention.config import BlockSizes, compiler_params
from pallas_kernels.power_retention.kernel_math import F32, Matmul, dot
from pallas_kernels.vma import out_struct


def _advance(S, gamma, xs, us, mm: Matmul):
    """gamma * S (rows with gamma 0 dropped) + sum_r x_r^T u_r, float32."""
    inc = dot(xs[0], us[0], mm, trans_x=True)
    for x, u in zip(xs[1:], us[1:]):
        inc = inc + dot(x, u, mm, trans_x=True)
    return jnp.where(gamma == 0, 0.0, gamma * S) + inc


def _tpu_kernel(x_ref, u_ref, gamma_ref, init_ref, before_ref, final_ref, acc_ref, *, mm):
    """One (b, h, chunk) step: save the running state, then advance it by one chunk."""
    t, n_chunks = pl.program_id(2), pl.num_programs(2)

    @pl.when(t == 0)
    def _():
        acc_ref[...] = init_ref[...]

    before_ref[...] = acc_ref[...]
    xs = [x_ref[r] for r in range(x_ref.shape[0])]
    us = [u_ref[r] for r in range(u_ref.shape[0])]
    acc_ref[...] = _advance(acc_ref[...], gamma_ref[...], xs, us, mm)

    @pl.when(t == n_chunks - 1)
    def _():
        final_ref[...] = acc_ref[...]


def _gpu_kernel(x_ref, u_ref, gamma_ref, init_ref, before_ref, final_ref, *, chunk, reverse, mm):
    """One (b, h) program: loop over all chunks with the state in registers, storing each boundary."""
    n_chunks = before_ref.shape[0]

    def body(t, S):
        n = n_chunks - 1 - t if reverse else t
        before_ref[n] = S
        span = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        xs = [x_ref[r, span, :] for r in range(x_ref.shape[0])]
        us = [u_ref[r, span, :] for r in range(u_ref.shape[0])]
        return _advance(S, gamma_ref[n], xs, us, mm)

    final_ref[...] = jax.lax.fori_loop(jnp.int32(0), jnp.int32(n_chunks), body, init_ref[...])


def state_pass(
    x,
    u,
    gamma,
    init,
    *,
    chunk: int,
    reverse: bool,
    backend: str,
    blocks: BlockSizes,
    mm: Matmul,
    interpret: bool,
):
    """Boundary states of S <- gamma_n S + sum_r x_r^T u_r over the chunks n (in order, or reversed).

    Args:
        x: x~ [B, H, R, Tp, d_k] (R = 1 forward, g backward), 0 where a token writes nothing.
        u: [B, H, R, Tp, d_v].
        gamma: the chunk decays [B, H, N, d_k, 1] float32.
        init: the state entering the first chunk processed [B, H, d_k, d_v] float32.
        chunk: tokens per chunk (Tp = N * chunk).
        reverse: run the chunks last to first.
        backend: "gpu" or "tpu".
        blocks: Triton's warps and stages (GPU).
        mm: the matmuls' operand dtype and precision.
        interpret: run in interpret mode.

    Returns:
        (before [B, H, N, d_k, d_v], final [B, H, d_k, d_v]), float32.
    """
    B, H, R, Tp, d_k = x.shape
    d_v = u.shape[-1]
    N = Tp // chunk
    out_shape = (out_struct((B, H, N, d_k, d_v), F32, x), out_struct((B, H, d_k, d_v), F32, x))
    if backend == "tpu":
        nth = (lambda t: N - 1 - t) if reverse else (lambda t: t)
        per_token = lambda width: pl.BlockSpec((None, None, R, chunk, width), lambda b, h, t: (b, h, 0, nth(t), 0))
        state = pl.BlockSpec((None, None, d_k, d_v), lambda b, h, t: (b, h, 0, 0))
        in_specs = [
            per_token(d_k),
            per_token(d_v),
            pl.BlockSpec((None, None, None, d_k, 1), lambda b, h, t: (b, h, nth(t), 0, 0)),
            state,
        ]
        out_specs = [pl.BlockSpec((None, None, None, d_k, d_v), lambda b, h, t: (b, h, nth(t), 0, 0)), state]
        return pl.pallas_call(
            partial(_tpu_kernel, mm=mm),
            grid=(B, H, N),
            in_specs=in_specs,
            out_specs=out_specs,
            out_shape=out_shape,
            scratch_shapes=[pltpu.VMEM((d_k, d_v), F32)],
            compiler_params=compiler_params(backend, blocks, ("parallel", "parallel", "arbitrary")),
            interpret=interpret,
        )(x, u, gamma, init)
    whole = lambda *tail: pl.BlockSpec((None, None, *tail), lambda b, h: (b, h) + (0,) * len(tail))
    return pl.pallas_call(
        partial(_gpu_kernel, chunk=chunk, reverse=reverse, mm=mm),
        grid=(B, H),
        in_specs=[whole(R, Tp, d_k), whole(R, Tp, d_v), whole(N, d_k, 1), whole(d_k, d_v)],
        out_specs=[whole(N, d_k, d_v), whole(d_k, d_v)],
        out_shape=out_shape,
        compiler_params=compiler_params(backend, blocks, ()),
        interpret=interpret,
    )(x, u, gamma, init)
