"""Chunked power retention from the kernels, under `jax.custom_vjp`.

Forward: state pass (k, v; chunks in order) -> boundary states S_before; Z (the normaliser's d x d state, d times
smaller than S) by a short XLA scan; then the output kernel (output_kernel.py), parallel over chunks. Saved for the
backward: the inputs, S_before (in the matmul operand dtype), Z_before, y and den (no recomputation of states).
Backward: dnum = dy / den and dden = -(dy . y) / den (XLA, elementwise: -(dy . y) / den is the exact derivative of
num / den in den, and finite wherever y is); the same state pass on (q, dnum) in reverse -> dS_after per chunk and
the initial state's gradient; dZ by a reverse XLA scan; then the gradient kernel (gradient_kernel.py), parallel over
chunks. Gates enter as F and R (see the package docstring); F gets a gradient per token, R none. With
`BlockSizes.forward == "mosaic"` both forward kernels are the Mosaic GPU ones (mosaic_forward.py), which save the
same residuals; the backward is unchanged.
"""

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from einops import rearrange

from pallas_kernels.power_retention import mosaic_forward
from pallas_kernels.power_retention.config import BlockSizes
from pallas_kernels.power_retention.gradient_kernel import chunk_grads
from pallas_kernels.power_retention.kernel_math import DEG, F32, Matmul
from pallas_kernels.power_retention.output_kernel import output_chunks
from pallas_kernels.power_retention.state_pass import state_pass


class Settings(NamedTuple):
    """Static settings of one call (hashable)."""

    chunk: int
    scale: float
    backend: str
    blocks: BlockSizes
    mm: Matmul
    interpret: bool


def _kernel_args(s: Settings):
    return dict(backend=s.backend, blocks=s.blocks, mm=s.mm, interpret=s.interpret)


class ChunkGates(NamedTuple):
    """F and R per chunk as columns [B, H, N, c, 1] and rows [B, H, N, 1, c]; the state pass's per-token factors
    and masks [B, H, Tp, 1] for keys (fk, write) and queries (fq, read); per chunk gamma and carry [B, H, N, 1, 1]."""

    Fc: jax.Array
    Fr: jax.Array
    Rc: jax.Array
    Rr: jax.Array
    fk: jax.Array
    write: jax.Array
    fq: jax.Array
    read: jax.Array
    gamma: jax.Array
    carry: jax.Array


def _gates(F, R, chunk, scale) -> ChunkGates:
    """The masked factors of kernel_math.gates for every chunk, in XLA, from F and R [B, H, Tp]."""
    F_BHNc, R_BHNc = (rearrange(x, "B H (N c) -> B H N c", c=chunk) for x in (F, R))
    F_end, R_end = F_BHNc[..., -1:], R_BHNc[..., -1:]
    read, write, carry = R_BHNc == 0, R_BHNc == R_end, R_end == 0
    fq = jnp.where(read, scale * jnp.exp(jnp.where(read, F_BHNc, 0.0) / DEG), 0.0)
    fk = jnp.where(write, jnp.exp(jnp.where(write, F_end - F_BHNc, 0.0) / DEG), 0.0)
    gamma = jnp.where(carry, jnp.exp(jnp.where(carry, F_end, 0.0)), 0.0)
    per_token = lambda x: rearrange(x.astype(F32), "B H N c -> B H (N c) 1")
    per_chunk = lambda x: x.astype(F32)[..., None]
    return ChunkGates(
        F_BHNc[..., None],
        F_BHNc[..., None, :],
        R_BHNc[..., None],
        R_BHNc[..., None, :],
        per_token(fk),
        per_token(write),
        per_token(fq),
        per_token(read),
        per_chunk(gamma),
        per_chunk(carry),
    )


def _scan_Z(Z0, inc_BHNdd, gamma_BHN, carry_BHN, reverse):
    """Z <- gamma_n Z (dropped where carry_n is 0) + inc_n over chunks (reversed if asked); returns (Z before each
    chunk [B, H, N, d, d], final)."""

    def body(Z, xs):
        gamma_BH, carry_BH, inc = xs
        return jnp.where(carry_BH[..., None, None] > 0, gamma_BH[..., None, None] * Z, 0.0) + inc, Z

    xs = (jnp.moveaxis(gamma_BHN, 2, 0), jnp.moveaxis(carry_BHN, 2, 0), jnp.moveaxis(inc_BHNdd, 2, 0))
    final, before = jax.lax.scan(body, Z0, xs, reverse=reverse)
    return jnp.moveaxis(before, 0, 2), final


def _symmetrise(x):
    """(x + x^T) / 2 over axes 2 and 3: a state cotangent, made symmetric like the states it pairs with."""
    return 0.5 * (x + jnp.swapaxes(x, 2, 3))


def _outer(x_t, w, chunk):
    """sum over each chunk's tokens (and heads g) of w x~ x~^T: [B, H, N, d, d] from x~ [B, H, g, Tp, d] and weights
    w [B, H, g, Tp] (the normaliser state's increment), float32 with exact products."""
    x_c = rearrange(x_t, "B H g (N c) d -> B H g N c d", c=chunk)
    w_c = rearrange(w, "B H g (N c) -> B H g N c", c=chunk)
    return jnp.einsum("bhgncx,bhgnc,bhgncy->bhnxy", x_c, w_c, x_c, precision=jax.lax.Precision.HIGHEST)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def chunked_core(s: Settings, q, k, v, F, R, S0, Z0):
    """q [B, H, g, Tp, d], k and v [B, H, Tp, d], F and R [B, H, Tp] (per chunk, see the package docstring),
    S0 [B, H, d, d, e] and Z0 [B, H, d, d] expanded. Returns (y [B, H*g, Tp, e] float32, S_final, Z_final)."""
    return _forward(s, q, k, v, F, R, S0, Z0)[0]


def _forward(s, q, k, v, F, R, S0, Z0):
    """The forward pass: ((y, S_final, Z_final), residuals for `_backward`)."""
    B, H, g, Tp, d = q.shape
    cg = _gates(F, R, s.chunk, s.scale)
    k_t = jnp.where(cg.write > 0, k.astype(F32) * cg.fk, 0.0)
    mosaic = dict(chunk=s.chunk, rows=s.blocks.rows(d)[0], emulate=s.interpret) if s.blocks.forward == "mosaic" else {}
    if mosaic:
        S_before, S_final = mosaic_forward.boundary_states(k_t, v, cg.gamma, cg.carry, S0, **mosaic)
    else:
        S_before, S_final = state_pass(
            k[:, :, None],
            v[:, :, None],
            cg.fk,
            cg.write,
            cg.gamma,
            cg.carry,
            S0,
            chunk=s.chunk,
            reverse=False,
            **_kernel_args(s),
        )
    Z_before, Z_final = _scan_Z(
        Z0,
        _outer(k_t[:, :, None], jnp.ones((B, H, 1, Tp), F32), s.chunk),
        cg.gamma[..., 0, 0],
        cg.carry[..., 0, 0],
        reverse=False,
    )
    if mosaic:
        y, den = mosaic_forward.chunk_outputs(
            q, k, v, F, R, cg.fq, cg.read, S_before, Z_before, scale=s.scale, **mosaic
        )
    else:
        y, den = output_chunks(
            q.reshape(B, H * g, Tp, d),
            k,
            v,
            cg.Fc,
            cg.Fr,
            cg.Rc,
            cg.Rr,
            S_before,
            Z_before,
            scale=s.scale,
            **_kernel_args(s),
        )
    return (y, S_final, Z_final), (q, k, v, F, R, S_before, Z_before, y, den)


def _backward(s, res, cts):
    """Gradients w.r.t. (q, k, v, F, R, S0, Z0) from the cotangents of (y, S_final, Z_final)."""
    q, k, v, F, R, S_before, Z_before, y, den = res
    dy, dS_final, dZ_final = cts
    B, H, g, Tp, _ = q.shape
    cg = _gates(F, R, s.chunk, s.scale)
    zero = den == 0
    safe_den = jnp.where(zero, 1.0, den)
    dnum = jnp.where(zero, 0.0, dy / safe_den).reshape(B, H, g, Tp, -1)
    dden = jnp.where(zero, 0.0, -jnp.sum(dy * y, axis=-1, keepdims=True) / safe_den).reshape(B, H, g, Tp, 1)
    fq, read = cg.fq[:, :, None], cg.read[:, :, None]
    dS_after, dS0 = state_pass(
        q,
        dnum,
        cg.fq,
        cg.read,
        cg.gamma,
        cg.carry,
        _symmetrise(dS_final),
        chunk=s.chunk,
        reverse=True,
        **_kernel_args(s),
    )
    q_t = jnp.where(read > 0, q.astype(F32) * fq, 0.0)
    dZ_after, dZ0 = _scan_Z(
        _symmetrise(dZ_final),
        _outer(q_t, dden[..., 0], s.chunk),
        cg.gamma[..., 0, 0],
        cg.carry[..., 0, 0],
        reverse=True,
    )
    dden_row = rearrange(dden, "B H g (N c) 1 -> B H g N 1 c", c=s.chunk)
    dq, dk, dv, dFq, dFk = chunk_grads(
        q,
        k,
        v,
        cg.Fc,
        cg.Fr,
        cg.Rc,
        cg.Rr,
        dnum,
        dden,
        dden_row,
        S_before,
        dS_after,
        Z_before,
        dZ_after,
        scale=s.scale,
        **_kernel_args(s),
    )
    dF = dFk[..., 0] + jnp.sum(dFq[..., 0], axis=2)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dF, jnp.zeros_like(R), dS0, dZ0


chunked_core.defvjp(_forward, _backward)
