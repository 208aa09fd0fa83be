"""The Pallas kernels behind the gated delta rule (`pallas_kernels.gated_delta_rule`, impl="pallas"): this file is
the op's only importer of them.

The chunked path's start is the XLA path's own (`chunked.delta_chunks`) with the chunks' WY/UT operands (A, W, U: one
unit-triangular solve per chunk) from the operands kernel in place of `chunked.xla_operands`; the sequential pass over
chunks is the second kernel; both forward and backward. As for GLA's kernels, the bad tokens enter
cleaned and NaN is put back by mask from a bad token to its document's end, and in the final state when the last
document holds one (`matrix_state.poisoned_tokens`). Under a mesh the kernels run in a shard_map over its batch and
head axes (`matrix_state.kernels_on_mesh`).
"""

from functools import partial

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

import pallas_kernels.gated_delta_rule as kernels
from retention.ops.gated_delta_rule.chunked import delta_chunks
from retention.ops.matrix_state import (
    SCALAR_ROLES,
    SEGMENT_ROLES,
    STATE_ROLES,
    TOKEN_ROLES,
    from_chunks,
    kernel_chunk,
    kernels_on_mesh,
    poisoned_tokens,
)
from retention.ops.platform import kernel_backend, kernel_interpret


def gated_delta_rule_pallas(
    q: Float[Array, "B T Hq dk"],
    k: Float[Array, "B T H dk"],
    v: Float[Array, "B T H dv"],
    beta: Float[Array, "B T H"],
    log_g: Float[Array, "B T H"] | None,
    initial_state: Float[Array, "B H dk dv"] | None,
    *,
    segment_ids: Int[Array, "B T"] | None,
    scale: float,
    chunk_size: int,
    backend: str | None = None,
    interpret: bool | None = None,
) -> tuple[Float[Array, "B T Hq dv"], Float[Array, "B H dk dv"]]:
    """`gated_delta_rule_chunked` on the kernels: the same arguments and result, inputs validated by the op.

    Args:
        q: queries [B, T, Hq, d_k].
        k: keys [B, T, H, d_k].
        v: values [B, T, H, d_v].
        beta: write strengths [B, T, H].
        log_g: log decays [B, T, H] or None.
        initial_state: S_0 [B, H, d_k, d_v] float32, or None (zeros).
        segment_ids: int [B, T] or None.
        scale: multiplies q.
        chunk_size: the op's chunk (`matrix_state.kernel_chunk` rounds it up for the kernels).
        backend: "gpu" or "tpu" kernels; None: the target platform's (`retention.ops.platform`).
        interpret: run in interpret mode; None: on a CPU target.

    Returns:
        (o [B, T, Hq, d_v] in v's dtype, the final state [B, H, d_k, d_v] float32).

    Raises:
        ValueError: a shape the kernels of `backend` do not support (`kernels.check_supported`), naming it.
    """
    interpret, backend = kernel_interpret(interpret), kernel_backend(backend)
    run = partial(_on_device, scale=scale, chunk=kernel_chunk(chunk_size), backend=backend, interpret=interpret)
    args = (q, k, v, beta, log_g, initial_state, segment_ids)
    roles = (TOKEN_ROLES, TOKEN_ROLES, TOKEN_ROLES, SCALAR_ROLES, SCALAR_ROLES, STATE_ROLES, SEGMENT_ROLES)
    return kernels_on_mesh(run, q, k, args, roles, interpret=interpret)


def _on_device(q, k, v, beta, log_g, initial_state, segment_ids, *, scale, chunk, backend, interpret):
    """`gated_delta_rule_pallas` on one device's rows and kv-heads."""
    T, Hq, H = q.shape[1], q.shape[2], k.shape[2]
    on_kernels = partial(kernels.chunk_operands, interpret=interpret, backend=backend)
    tokens, _, x, S0 = delta_chunks(
        q, k, v, beta, log_g, initial_state, segment_ids=segment_ids, scale=scale, chunk_size=chunk, operands=on_kernels
    )
    o, S = kernels.chunked_delta(
        x.q,
        x.A,
        x.W,
        x.U,
        x.k_out,
        x.decay,
        S0,
        interpret=interpret,
        backend=backend,
    )
    poisoned = poisoned_tokens(tokens)
    o = jnp.where(jnp.repeat(poisoned, Hq // H, axis=2)[..., None], jnp.nan, from_chunks(o, T))
    return o.astype(v.dtype), jnp.where(poisoned[:, -1, :, None, None], jnp.nan, S)
