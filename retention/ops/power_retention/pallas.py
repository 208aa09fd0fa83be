"""The Pallas kernels behind the op (`pallas_kernels.power_retention`, degree 2): this file is their only importer.

It converts RetentionState to and from the kernels' expanded state (expanded_state.py) around the chunked kernels,
and runs a decode step as `chunk_step` with the kernel's pass over S in place of XLA's; that pass's gradient is the
XLA pass's (`xla_state_pass`, under `jax.custom_vjp`), so the step differentiates like the XLA step.
"""

from functools import partial

import jax

import pallas_kernels.power_retention as kernels
from pallas_kernels.power_retention import BlockSizes
from retention.ops.power_retention.expanded_state import from_expanded, to_expanded
from retention.ops.power_retention.gates import LOG_G_ZERO
from retention.ops.power_retention.recurrent import chunk_step, xla_state_pass
from retention.ops.power_retention.state import RetentionState
from retention.validation import concrete


def check_pallas(deg: int, d: int, g: int, chunk: int | None = None, backend: str | None = None) -> None:
    """Raise NotImplementedError or ValueError for what the kernels of `backend` (None: the default device's) do
    not support: degree `deg`, head dim d, g query heads per kv-head, chunk size `chunk` (None: not chunked)."""
    kernels.check_supported(deg, d, g, kernels.resolve_backend(backend), chunk)


def check_resets(log_g, segment_ids) -> None:
    """Until the kernels take the reset contract's F and R (`gates.chunk_gates`): NotImplementedError for
    segment_ids, and for -inf gates where log_g's values are known (traced ones cannot be seen here)."""
    if segment_ids is not None:
        raise NotImplementedError("impl='pallas' does not take segment_ids yet; use impl='xla' (or 'auto')")
    values = None if log_g is None else concrete(log_g)
    if values is not None and (values <= LOG_G_ZERO).any():
        raise NotImplementedError(f"impl='pallas' does not take log_g <= {LOG_G_ZERO} (a reset) yet; use impl='xla'")


def pallas_supports(deg: int, d: int, g: int, chunk: int | None = None, backend: str | None = None) -> bool:
    """Whether `check_pallas` passes."""
    try:
        check_pallas(deg, d, g, chunk, backend)
    except (NotImplementedError, ValueError):
        return False
    return True


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
    chunk_size: int,
    backend: str | None = None,
    interpret: bool | None = None,
    block_sizes: BlockSizes | None = None,
):
    """`power_retention_chunked` on the kernels: (y in v's dtype, the final state), shapes as `power_retention`'s.
    Inputs validated by the op; `backend` ('gpu' or 'tpu', None: the default device's), `interpret` (None: on CPU)
    and `block_sizes` (None: the backend's defaults) as in the kernels."""
    Hq, d = q.shape[2:]
    check_pallas(deg, d, Hq // k.shape[2], chunk_size, backend)
    check_resets(log_g, segment_ids)
    y, S_exp, Z = kernels.chunked_retention(
        q,
        k,
        v,
        log_g,
        *to_expanded(state),
        scale=scale,
        chunk_size=chunk_size,
        interpret=interpret,
        block_sizes=block_sizes,
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
    check_pallas(deg, q.shape[-1], q.shape[2] // k.shape[2], None, backend)
    check_resets(log_g, segment_ids)
    options = (kernels.matmul_precision(q.dtype), backend, interpret, block_sizes)
    state_pass = lambda *args: _kernel_state_pass(*args, options)
    return chunk_step(state, q, k, v, log_g, deg=deg, scale=scale, state_pass=state_pass)
