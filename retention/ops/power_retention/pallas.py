"""The Pallas kernels behind the op (`pallas_kernels.power_retention`, degree 2): this file is their only importer.

It converts RetentionState to and from the kernels' expanded state (expanded_state.py) around the chunked kernels,
turns log_g and segment_ids into the kernels' per-chunk gates (`kernel_gates`, the reset contract), and runs a decode
step as `chunk_step` with the kernel's pass over S in place of XLA's; that pass's gradient is the XLA pass's
(`xla_state_pass`, under `jax.custom_vjp`), so the step differentiates like the XLA step. Under a mesh, op.py runs
these through `pallas_mesh.py` (a shard_map over the batch and heads).
"""

from functools import partial

import jax
import jax.numpy as jnp
from einops import rearrange

import pallas_kernels.power_retention as kernels
from pallas_kernels.power_retention import BlockSizes
from retention.ops.platform import kernel_backend, kernel_interpret
from retention.ops.power_retention.expanded_state import from_expanded, to_expanded
from retention.ops.power_retention.gates import chunk_gates
from retention.ops.power_retention.recurrent import chunk_step, xla_state_pass
from retention.ops.power_retention.state import RetentionState


def check_pallas(deg: int, d: int, g: int, chunk: int | None = None, backend: str | None = None) -> None:
    """Raise NotImplementedError or ValueError for what the kernels of `backend` (None: the default device's) do
    not support: degree `deg`, head dim d, g query heads per kv-head, chunk size `chunk` (None: not chunked)."""
    kernels.check_supported(deg, d, g, kernel_backend(backend), chunk)


def pallas_supports(deg: int, d: int, g: int, chunk: int | None = None, backend: str | None = None) -> bool:
    """Whether `check_pallas` passes."""
    try:
        check_pallas(deg, d, g, chunk, backend)
    except (NotImplementedError, ValueError):
        return False
    return True


def interpreted(impl: str) -> bool:
    """Whether `impl` runs the kernels in interpret mode ("pallas" on CPU). A shard_map around such kernels must
    run with check_vma=False: in JAX 0.11.2 the interpreter slices each (varying) input by invariant grid indices,
    which the varying-axes check rejects (on GPU and TPU the kernels type their outputs, pallas_kernels/vma.py)."""
    return impl == "pallas" and kernel_interpret()


def kernel_gates(k, v, log_g, segment_ids, chunk: int):
    """The reset contract's gates (`gates.chunk_gates`, the one preprocessing every path shares) in the kernels'
    layout: (k, v [B, T, H, d] with their non-finite tokens zeroed, F, R [B, T, H] float32 per chunk of `chunk`
    tokens). log_g [B, T, H] or None, segment_ids [B, T] int or None."""
    T = k.shape[1]
    gates = chunk_gates(k, v, log_g, segment_ids, chunk_size=chunk)
    tokens = lambda x: rearrange(x, "B N H c -> B (N c) H")[:, :T].astype(jnp.float32)
    return gates.k, gates.v, tokens(gates.F), tokens(gates.R)


def chunked_pallas(
    q,
    k,
    v,
    log_g,
    state: RetentionState,
    *,
    segment_ids=None,
    deg: int,
    scale: float,
    chunk_size: int | None,
    backend: str | None = None,
    interpret: bool | None = None,
    block_sizes: BlockSizes | None = None,
):
    """`power_retention_chunked` on the kernels: (y in v's dtype, the final state), shapes as `power_retention`'s,
    segment_ids [B, T] int or None (a new document resets the state, see `kernel_gates`). Inputs validated by the
    op; `chunk_size` None takes the kernels' (BlockSizes.chunk, `kernels.chunk_for`); `backend` ('gpu' or 'tpu',
    None: the target platform's, `retention.ops.platform`), `interpret` (None: on a CPU target) and `block_sizes`
    (None: the backend's defaults, tuned where `gpu_check` wrote them) as in the kernels."""
    B, T, Hq, d = q.shape
    H = k.shape[2]
    backend, interpret = kernel_backend(backend), kernel_interpret(interpret)
    blocks = block_sizes or kernels.default_block_sizes(backend, d)
    chunk = chunk_size or kernels.chunk_for(T, blocks)
    check_pallas(deg, d, Hq // H, chunk, backend)
    k, v, F, R = kernel_gates(k, v, log_g, segment_ids, chunk)
    y, S_exp, Z = kernels.chunked_retention(
        q,
        k,
        v,
        F,
        R,
        *to_expanded(state),
        scale=scale,
        chunk_size=chunk,
        interpret=interpret,
        block_sizes=blocks,
        backend=backend,
    )
    return y, from_expanded(S_exp, Z)


@partial(jax.custom_vjp, nondiff_argnums=(5,))
def _kernel_state_pass(q_t, k_t, u, gamma, S, options):
    """The decode kernel's (read, updated S); `options` = (precision, backend, interpret, block_sizes)."""
    precision, backend, interpret, block_sizes = options
    return kernels.decode_state_pass(
        q_t, k_t, u, gamma, S, precision=precision, interpret=interpret, block_sizes=block_sizes, backend=backend
    )


def _kernel_state_pass_fwd(q_t, k_t, u, gamma, S, options):
    return _kernel_state_pass(q_t, k_t, u, gamma, S, options), (q_t, k_t, u, gamma, S)


def _kernel_state_pass_bwd(options, residuals, cotangents):
    return jax.vjp(partial(xla_state_pass, deg=2), *residuals)[1](cotangents)


_kernel_state_pass.defvjp(_kernel_state_pass_fwd, _kernel_state_pass_bwd)


def step_pallas(
    state: RetentionState,
    q,
    k,
    v,
    log_g,
    *,
    segment_ids=None,
    deg: int,
    scale: float,
    backend: str | None = None,
    interpret: bool | None = None,
    block_sizes: BlockSizes | None = None,
):
    """`chunk_step` with the decode kernel's pass over S: (y in v's dtype, the updated state), shapes as
    `power_retention_step`'s. Inputs validated by the op; `backend`, `interpret`, `block_sizes` as in
    `chunked_pallas`."""
    backend, interpret = kernel_backend(backend), kernel_interpret(interpret)
    check_pallas(deg, q.shape[-1], q.shape[2] // k.shape[2], None, backend)
    options = (kernels.matmul_precision(q.dtype), backend, interpret, block_sizes)
    state_pass = lambda *args: _kernel_state_pass(*args, options)
    return chunk_step(state, q, k, v, log_g, segment_ids=segment_ids, deg=deg, scale=scale, state_pass=state_pass)
