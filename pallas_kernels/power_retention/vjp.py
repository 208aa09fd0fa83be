"""Chunked power retention from the kernels, under `jax.custom_vjp`.

Forward: state pass (k, v; chunks in order) -> boundary states S_before; Z (the normaliser's d x d state, d times
smaller than S) by a short XLA scan; then the output kernel (output_kernel.py), parallel over chunks. Saved for the
backward: the inputs, S_before, Z_before, y and den (no recomputation of states).
Backward: dnum = dy / den and dden = -(dy . y) / den (XLA, elementwise); the same state pass on (q, dnum) in reverse
-> dS_after per chunk and the initial state's gradient; dZ by a reverse XLA scan; then the gradient kernel
(gradient_kernel.py), parallel over chunks.
"""

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from einops import rearrange

from pallas_kernels.power_retention.chunk_math import DEG, F32
from pallas_kernels.power_retention.config import BlockSizes
from pallas_kernels.power_retention.gradient_kernel import chunk_grads
from pallas_kernels.power_retention.output_kernel import output_chunks
from pallas_kernels.power_retention.state_pass import state_pass


class Settings(NamedTuple):
    """Static settings of one call (hashable)."""

    chunk: int
    scale: float
    backend: str
    blocks: BlockSizes
    precision: jax.lax.Precision
    interpret: bool


def _kernel_args(s: Settings):
    return dict(backend=s.backend, blocks=s.blocks, precision=s.precision, interpret=s.interpret)


def _gates(G, chunk):
    """From G [B, H, Tp] (cumsum within each chunk): Gc [B, H, N, c, 1], Gr [B, H, N, 1, c], gamma [B, H, N]."""
    G_BHNc = rearrange(G, "B H (N c) -> B H N c", c=chunk)
    return G_BHNc[..., None], G_BHNc[..., None, :], jnp.exp(G_BHNc[..., -1])


def _scan_Z(Z0, inc_BHNdd, gamma_BHN, reverse):
    """Z <- gamma_n Z + inc_n over chunks (reversed if asked); returns (Z before each chunk [B, H, N, d, d], final)."""

    def body(Z, xs):
        gamma_BH, inc = xs
        return gamma_BH[..., None, None] * Z + inc, Z

    xs = (jnp.moveaxis(gamma_BHN, 2, 0), jnp.moveaxis(inc_BHNdd, 2, 0))
    final, before = jax.lax.scan(body, Z0, xs, reverse=reverse)
    return jnp.moveaxis(before, 0, 2), final


def _symmetrise(x):
    """(x + x^T) / 2 over axes 2 and 3: a state cotangent, made symmetric like the states it pairs with."""
    return 0.5 * (x + jnp.swapaxes(x, 2, 3))


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def chunked_core(s: Settings, q, k, v, G, S0, Z0):
    """q [B, H, g, Tp, d], k and v [B, H, Tp, d], G [B, H, Tp] (cumsum of log_g within chunks), S0 [B, H, d, d, e]
    and Z0 [B, H, d, d] expanded. Returns (y [B, H*g, Tp, e] float32, S_final, Z_final)."""
    return _forward(s, q, k, v, G, S0, Z0)[0]


def _forward(s, q, k, v, G, S0, Z0):
    """The forward pass: ((y, S_final, Z_final), residuals for `_backward`)."""
    B, H, g, Tp, d = q.shape
    Gc, Gr, gamma = _gates(G, s.chunk)
    fk = rearrange(jnp.exp((Gr[..., 0, -1:] - Gr[..., 0, :]) / DEG), "B H N c -> B H (N c) 1")
    S_before, S_final = state_pass(
        k[:, :, None], v[:, :, None], fk, gamma[..., None, None], S0, chunk=s.chunk, reverse=False, **_kernel_args(s)
    )
    k_t = rearrange(k.astype(F32) * fk, "B H (N c) d -> B H N c d", c=s.chunk)
    Z_inc = jnp.einsum("bhncx,bhncy->bhnxy", k_t, k_t, precision=s.precision)
    Z_before, Z_final = _scan_Z(Z0, Z_inc, gamma, reverse=False)
    y, den = output_chunks(
        q.reshape(B, H * g, Tp, d), k, v, Gc, Gr, S_before, Z_before, scale=s.scale, **_kernel_args(s)
    )
    return (y, S_final, Z_final), (q, k, v, G, S_before, Z_before, y, den)


def _backward(s, res, cts):
    """Gradients w.r.t. (q, k, v, G, S0, Z0) from the cotangents of (y, S_final, Z_final)."""
    q, k, v, G, S_before, Z_before, y, den = res
    dy, dS_final, dZ_final = cts
    B, H, g, Tp, _ = q.shape
    Gc, Gr, gamma = _gates(G, s.chunk)
    ok = den > 0
    safe_den = jnp.where(ok, den, 1.0)
    dnum = jnp.where(ok, dy / safe_den, 0.0).reshape(B, H, g, Tp, -1)
    dden = jnp.where(ok, -jnp.sum(dy * y, axis=-1, keepdims=True) / safe_den, 0.0).reshape(B, H, g, Tp, 1)
    fq = s.scale * jnp.exp(G / DEG)[..., None]
    dS_after, dS0 = state_pass(
        q, dnum, fq, gamma[..., None, None], _symmetrise(dS_final), chunk=s.chunk, reverse=True, **_kernel_args(s)
    )
    q_t = rearrange(q.astype(F32) * fq[:, :, None], "B H g (N c) d -> B H g N c d", c=s.chunk)
    dden_c = rearrange(dden, "B H g (N c) 1 -> B H g N c", c=s.chunk)
    Z_inc = jnp.einsum("bhgncx,bhgnc,bhgncy->bhnxy", q_t, dden_c, q_t, precision=s.precision)
    dZ_after, dZ0 = _scan_Z(_symmetrise(dZ_final), Z_inc, gamma, reverse=True)
    dden_row = dden_c[..., None, :]
    dq, dk, dv, dGq, dGk = chunk_grads(
        q, k, v, Gc, Gr, dnum, dden, dden_row, S_before, dS_after, Z_before, dZ_after, scale=s.scale, **_kernel_args(s)
    )
    dG = dGk[..., 0] + jnp.sum(dGq[..., 0], axis=2)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dG, dS0, dZ0


chunked_core.defvjp(_forward, _backward)
