"""Chunked GLA from the kernels, under `jax.custom_vjp`.

Forward: the state pass (k~, v; chunks in order) -> the boundary states S_before; then the output kernel, parallel
over chunks. Saved for the backward: the inputs and S_before (no recomputation of states).
Backward: the same state pass on (q~, dO) in reverse -> the gradient of the state carried out of each chunk and the
initial state's; the chunk decays' gradient sum_e dS_after * S_before (XLA: one product of two saved arrays); then
the gradient kernel, parallel over chunks. F's gradient from the intra-chunk part is q . dq - k . dk per token
(intra.py); the gate factors q~ = q f_q, k~ = k f_k and gamma enter as inputs, so their own chain rule to F is the
caller's XLA autodiff.
"""

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float

from pallas_kernels.gated_linear_attention.gradient_kernel import chunk_grads
from pallas_kernels.gated_linear_attention.output_kernel import output_chunks
from pallas_kernels.gated_linear_attention.state_pass import state_pass
from pallas_kernels.power_retention.config import BlockSizes
from pallas_kernels.power_retention.kernel_math import F32, Matmul


class Settings(NamedTuple):
    """Static settings of one call (hashable): tokens per chunk and per sub-chunk, the backend, Triton's warps and
    stages (`blocks`), the matmuls and interpret mode."""

    chunk: int
    sub_chunk: int
    backend: str
    blocks: BlockSizes
    mm: Matmul
    interpret: bool


def _kernel_args(s: Settings) -> dict:
    return dict(backend=s.backend, blocks=s.blocks, mm=s.mm, interpret=s.interpret)


def _resets(R: Float[Array, "B H Tp"], s: Settings):
    """R as columns [B, H, Tp, 1] and as rows per sub-chunk [B, H, N, n, 1, s]."""
    rows = rearrange(R, "B H (N n s) -> B H N n 1 s", n=s.chunk // s.sub_chunk, s=s.sub_chunk)
    return R[..., None], rows


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def gla_core(s: Settings, q, k, v, F, R, q_gated, k_gated, gamma, S0):
    """Chunked GLA over Tp = N * chunk tokens.

    Args:
        s: the static settings.
        q: scaled queries [B, H, g, Tp, d_k].
        k: keys [B, H, Tp, d_k].
        v: values [B, H, Tp, d_v].
        F: cumulative log-gates per chunk [B, H, Tp, d_k] float32.
        R: reset counts per chunk [B, H, Tp] float32 (no gradient).
        q_gated: q~ = q f_q [B, H, g, Tp, d_k] float32 (0 after each chunk's first reset).
        k_gated: k~ = k f_k [B, H, Tp, d_k] float32 (0 outside each chunk's last document).
        gamma: the chunk decays [B, H, N, d_k, 1] float32 (0 where a chunk resets).
        S0: the initial state [B, H, d_k, d_v] float32.

    Returns:
        (o [B, H, g, Tp, d_v], the final state [B, H, d_k, d_v]), float32.
    """
    return _forward(s, q, k, v, F, R, q_gated, k_gated, gamma, S0)[0]


def _forward(s: Settings, q, k, v, F, R, q_gated, k_gated, gamma, S0):
    """((o, S_final), residuals for `_backward`)."""
    B, H, g, Tp, d_k = q.shape
    S_before, S_final = state_pass(
        k_gated[:, :, None], v[:, :, None], gamma, S0, chunk=s.chunk, reverse=False, **_kernel_args(s)
    )
    Rc, Rr = _resets(R, s)
    heads = lambda x: x.reshape(B, H * g, Tp, x.shape[-1])
    o = output_chunks(heads(q), k, v, F, Rc, Rr, heads(q_gated), S_before, **_kernel_args(s))
    o = o.reshape(B, H, g, Tp, v.shape[-1])
    return (o, S_final), (q, k, v, F, R, q_gated, k_gated, gamma, S_before)


def _backward(s: Settings, res, cts):
    """Gradients with respect to (q, k, v, F, R, q_gated, k_gated, gamma, S0) from those of (o, S_final)."""
    q, k, v, F, R, q_gated, k_gated, gamma, S_before = res
    do, dS_final = cts
    do = do.astype(F32)
    dS_after, dS0 = state_pass(q_gated, do, gamma, dS_final, chunk=s.chunk, reverse=True, **_kernel_args(s))
    row_sums = jnp.einsum("bhnde,bhnde->bhnd", dS_after, S_before, precision=jax.lax.Precision.HIGHEST)
    dgamma = jnp.where(gamma == 0, 0.0, row_sums[..., None])  # a dropped row has no gradient (as decay_state)
    Rc, Rr = _resets(R, s)
    dq, dq_gated, dk, dk_gated, dv = chunk_grads(q, k, v, F, Rc, Rr, do, k_gated, S_before, dS_after, **_kernel_args(s))
    dF = jnp.sum(q.astype(F32) * dq, axis=2) - k.astype(F32) * dk
    grads = (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dF, jnp.zeros_like(R))
    return grads + (dq_gated, dk_gated, dgamma, dS0)


gla_core.defvjp(_forward, _backward)
