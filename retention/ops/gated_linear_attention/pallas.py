"""The Pallas kernels behind gated linear attention (`pallas_kernels.gated_linear_attention`, impl="pallas"): this
file is the op's only importer of them.

It makes the reset contract's gates exactly as the XLA path does (`matrix_state.token_gates` and `chunk_gates`,
`chunked.state_factors`) in the kernels' token layout, runs the kernels, and puts NaN back where a bad token (a
non-finite k or v, a positive or NaN gate; the kernels see it zeroed) poisons its document: in that token's rows,
every later row of its document, and the final state when the last document holds one
(`matrix_state.poisoned_tokens`). Under a mesh the kernels run in a shard_map over its batch and head axes
(`matrix_state.kernels_on_mesh`).
"""

from functools import partial

import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float, Int

import pallas_kernels.gated_linear_attention as kernels
from retention.ops.gated_linear_attention.chunked import state_factors
from retention.ops.matrix_state import (
    SEGMENT_ROLES,
    STATE_ROLES,
    TOKEN_ROLES,
    chunk_gates,
    kernel_chunk,
    kernels_on_mesh,
    poisoned_tokens,
    token_gates,
)
from retention.ops.platform import kernel_backend, kernel_interpret


def gated_linear_attention_pallas(
    q: Float[Array, "B T Hq dk"],
    k: Float[Array, "B T H dk"],
    v: Float[Array, "B T H dv"],
    log_g: Float[Array, "B T H dk"],
    initial_state: Float[Array, "B H dk dv"] | None,
    *,
    segment_ids: Int[Array, "B T"] | None,
    scale: float,
    chunk_size: int,
    backend: str | None = None,
    interpret: bool | None = None,
) -> tuple[Float[Array, "B T Hq dv"], Float[Array, "B H dk dv"]]:
    """`gated_linear_attention_chunked` on the kernels: the same arguments and result, inputs validated by the op.

    Args:
        q: queries [B, T, Hq, d_k].
        k: keys [B, T, H, d_k].
        v: values [B, T, H, d_v].
        log_g: log decays per key channel [B, T, H, d_k], <= 0.
        initial_state: S_0 [B, H, d_k, d_v] float32, or None (zeros).
        segment_ids: int [B, T] or None.
        scale: multiplies q.
        chunk_size: the op's chunk (`kernel_chunk` rounds it up for the kernels).
        backend: "gpu" or "tpu" kernels; None: the target platform's (`retention.ops.platform`).
        interpret: run in interpret mode; None: on a CPU target.

    Returns:
        (o [B, T, Hq, d_v] in v's dtype, the final state [B, H, d_k, d_v] float32).

    Raises:
        ValueError: a shape the kernels of `backend` do not support (`kernels.check_supported`), naming it.
    """
    interpret, backend = kernel_interpret(interpret), kernel_backend(backend)
    run = partial(_on_device, scale=scale, chunk=kernel_chunk(chunk_size), backend=backend, interpret=interpret)
    args = (q, k, v, log_g, initial_state, segment_ids)
    roles = (TOKEN_ROLES, TOKEN_ROLES, TOKEN_ROLES, TOKEN_ROLES, STATE_ROLES, SEGMENT_ROLES)
    return kernels_on_mesh(run, q, k, args, roles, interpret=interpret)


def _on_device(q, k, v, log_g, initial_state, segment_ids, *, scale, chunk, backend, interpret):
    """`gated_linear_attention_pallas` on one device's rows and kv-heads."""
    B, T, Hq, d_k = q.shape
    H, d_v, c = k.shape[2], v.shape[-1], chunk
    tokens = token_gates(k, v, log_g, segment_ids, per_channel=True)
    gates = chunk_gates(tokens, c)
    f_q, f_k, gamma = state_factors(gates.F, gates.R)
    per_token = lambda x: rearrange(x, "B N H c ... -> B (N c) H ...")[:, :T]
    S0 = jnp.zeros((B, H, d_k, d_v), jnp.float32) if initial_state is None else initial_state
    o, S = kernels.chunked_gla(
        q,
        tokens.k,
        tokens.v,
        per_token(gates.F),
        per_token(gates.R),
        per_token(f_q),
        per_token(f_k),
        gamma,
        S0,
        scale=scale,
        chunk_size=c,
        interpret=interpret,
        backend=backend,
    )
    poisoned = poisoned_tokens(tokens)
    o = jnp.where(jnp.repeat(poisoned, Hq // H, axis=2)[..., None], jnp.nan, o)
    return o, jnp.where(poisoned[:, -1, :, None, None], jnp.nan, S)
