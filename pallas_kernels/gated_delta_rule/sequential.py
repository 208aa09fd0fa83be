"""A sequential pass over chunks as one Pallas kernel: a [d_k, d_v] state carried from chunk to chunk (in order or
reversed), per-chunk inputs read and per-chunk outputs written by a `step` function, parallel over (B, H).

TPU: grid (B, H, N), the chunk axis last ("arbitrary"), the state in a VMEM scratch, each chunk's blocks streamed by
the pipeline. GPU (Triton): grid (B, H), each program loops over the N chunks with the state in registers, reading
and writing whole-sequence blocks at the chunk's index.
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.power_retention.config import BlockSizes, compiler_params
from pallas_kernels.power_retention.kernel_math import F32
from pallas_kernels.vma import out_struct


def _accessors(ins, outs, at: tuple):
    """load(i, *idx) -> ins[i][at, idx, ...] as a value; store(j, value, *idx) writes outs[j][at, idx, ...]."""

    def load(i, *idx):
        return ins[i][(*at, *idx, Ellipsis)]

    def store(j, value, *idx):
        outs[j][(*at, *idx, Ellipsis)] = value.astype(outs[j].dtype)

    return load, store


def _tpu_kernel(*refs, step, n_in, n_out):
    """One (b, h, chunk) step: the state from the scratch (the initial one at the first chunk), `step`, back."""
    ins, init_ref = refs[:n_in], refs[n_in]
    outs, final_ref, acc_ref = refs[n_in + 1 : n_in + 1 + n_out], refs[n_in + 1 + n_out], refs[-1]
    t = pl.program_id(2)

    @pl.when(t == 0)
    def _():
        acc_ref[...] = init_ref[...]

    acc_ref[...] = step(*_accessors(ins, outs, ()), acc_ref[...])

    @pl.when(t == pl.num_programs(2) - 1)
    def _():
        final_ref[...] = acc_ref[...]


def _gpu_kernel(*refs, step, n_in, n_out, n_chunks, reverse):
    """One (b, h) program: `step` over all chunks with the state in registers."""
    ins, init_ref = refs[:n_in], refs[n_in]
    outs, final_ref = refs[n_in + 1 : n_in + 1 + n_out], refs[n_in + 1 + n_out]

    def body(t, S):
        n = n_chunks - 1 - t if reverse else t
        return step(*_accessors(ins, outs, (n,)), S)

    final_ref[...] = jax.lax.fori_loop(jnp.int32(0), jnp.int32(n_chunks), body, init_ref[...])


def sequential_pass(
    step,
    chunk_inputs: list,
    init,
    chunk_outputs: list[tuple[tuple[int, ...], jnp.dtype]],
    *,
    reverse: bool,
    backend: str,
    blocks: BlockSizes,
    interpret: bool,
):
    """Run `step` over the chunks of every (b, h).

    Args:
        step: step(load, store, S) -> S': load(i, *idx) reads chunk input i (at idx inside the chunk's block),
            store(j, value, *idx) writes chunk output j; S the [d_k, d_v] float32 state entering the chunk.
        chunk_inputs: arrays [B, H, N, ...].
        init: the state entering the first chunk processed [B, H, d_k, d_v] float32.
        chunk_outputs: (per-chunk shape, dtype) of each output; they come back as [B, H, N, *shape].
        reverse: run the chunks last to first.
        backend: "gpu" or "tpu".
        blocks: Triton's warps and stages (GPU).
        interpret: run in interpret mode.

    Returns:
        (the chunk outputs, the final state [B, H, d_k, d_v] float32).
    """
    B, H, N = chunk_inputs[0].shape[:3]
    state_shape = init.shape[2:]
    out_shape = [out_struct((B, H, N, *shape), dtype, init) for shape, dtype in chunk_outputs]
    out_shape.append(out_struct(init.shape, F32, init))
    n_in, n_out = len(chunk_inputs), len(chunk_outputs)
    tails = [x.shape[3:] for x in chunk_inputs] + [shape for shape, _ in chunk_outputs]
    if backend == "tpu":
        nth = (lambda t: N - 1 - t) if reverse else (lambda t: t)
        chunk_spec = lambda tail: pl.BlockSpec(
            (None, None, None, *tail), lambda b, h, t: (b, h, nth(t)) + (0,) * len(tail)
        )
        per_head = pl.BlockSpec((None, None, *state_shape), lambda b, h, t: (b, h, 0, 0))
        kernel = partial(_tpu_kernel, step=step, n_in=n_in, n_out=n_out)
        grid, scratch = (B, H, N), [pltpu.VMEM(state_shape, F32)]
        semantics = ("parallel", "parallel", "arbitrary")
    else:
        chunk_spec = lambda tail: pl.BlockSpec((None, None, N, *tail), lambda b, h: (b, h, 0) + (0,) * len(tail))
        per_head = pl.BlockSpec((None, None, *state_shape), lambda b, h: (b, h, 0, 0))
        kernel = partial(_gpu_kernel, step=step, n_in=n_in, n_out=n_out, n_chunks=N, reverse=reverse)
        grid, scratch, semantics = (B, H), [], ()
    per_chunk = [chunk_spec(tail) for tail in tails]
    results = pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=per_chunk[:n_in] + [per_head],
        out_specs=per_chunk[n_in:] + [per_head],
        out_shape=out_shape,
        scratch_shapes=scratch,
        compiler_params=compiler_params(backend, blocks, semantics),
        interpret=interpret,
    )(*chunk_inputs, init)
    return results[:-1], results[-1]
