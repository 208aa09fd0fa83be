"""Decode: n >= 1 new tokens as one chunk against the state (the recurrent form, S and z kept apart).

S_t = g_t S_{t-1} + phi(k_t) v_t^T and z_t = g_t z_{t-1} + phi(k_t); y_t = phi(scale q_t) S_t / phi(scale q_t) z_t.
A decode step is bound by the pass over S (read, then the in-place update); `chunk_step` takes that pass as an
argument, so the Pallas decode kernel (`pallas.py`) replaces it and everything else stays this file's.
"""

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float

from retention.ops.power_retention.chunk_math import gate_factors, intra_chunk, normalise, state_read, state_write
from retention.ops.power_retention.state import RetentionState

StatePass = Callable[..., tuple[Array, Array]]  # (q~ [B,H,m,d], k~ [B,H,n,d], u [B,H,n,e], gamma [B,H], S) -> (read, S)


def xla_state_pass(q_t, k_t, u, gamma, S, *, deg: int):
    """(phi(q~) S [B, H, m, e], gamma S + phi(k~)^T u [B, H, D, e]) for q~ [B, H, m, d], k~ [B, H, n, d],
    u [B, H, n, e], gamma [B, H] and S [B, H, D, e]: the read, then the update.

    The barrier orders the update after the read, so it happens in place (without it XLA copies S every step,
    twice the bytes per token)."""
    read, S = jax.lax.optimization_barrier((state_read(q_t, S, deg), S))
    return read, gamma[..., None, None] * S + state_write(k_t, u, deg)


def chunk_step(
    state: RetentionState,
    q: Float[Array, "B n Hq d"],
    k: Float[Array, "B n H d"],
    v: Float[Array, "B n H d"],
    log_g: Float[Array, "B n H"] | None,
    *,
    deg: int,
    scale: float,
    state_pass: StatePass | None = None,
) -> tuple[Float[Array, "B n Hq d"], RetentionState]:
    """n >= 1 new tokens as one chunk against `state`; returns (y [B, n, Hq, d] in v's dtype, the updated state).

    Row i reads phi(q_i exp(G_i / p)) . (S, z), G_i the gates of tokens 1..i of the chunk, plus the chunk's own
    keys directly: (q_i . k_j)^p exp(G_i - G_j) for j <= i. S and z are kept apart (no [S | z] copy per call, which
    costs more than the step itself at decode). `state_pass` computes the read and update of S (default: XLA,
    `xla_state_pass`); z's always runs in XLA."""
    H, n = k.shape[2], k.shape[1]
    f32 = jnp.float32
    q_BHgnd = rearrange(q.astype(f32) * scale, "B n (H g) d -> B H g n d", H=H)
    k_BHnd = rearrange(k.astype(f32), "B n H d -> B H n d")
    v_BHnd = rearrange(v.astype(f32), "B n H d -> B H n d")
    log_g = jnp.zeros(k.shape[:3], f32) if log_g is None else log_g.astype(f32)
    G_BHn = jnp.cumsum(rearrange(log_g, "B n H -> B H n"), axis=-1)
    fq_BHn, fk_BHn, gamma_BH = gate_factors(G_BHn, deg)
    q_t = rearrange(q_BHgnd * fq_BHn[:, :, None, :, None], "B H g n d -> B H (g n) d")
    k_t = k_BHnd * fk_BHn[..., None]
    ones = jnp.ones(v_BHnd.shape[:-1] + (1,), f32)

    read_S, S = (state_pass or partial(xla_state_pass, deg=deg))(q_t, k_t, v_BHnd, gamma_BH, state.S)
    read_z, z = xla_state_pass(q_t, k_t, ones, gamma_BH, state.z[..., None], deg=deg)
    read = rearrange(jnp.concatenate([read_S, read_z], axis=-1), "B H (g n) e -> B H g n e", n=n)
    intra = intra_chunk(q_BHgnd, k_BHnd, jnp.concatenate([v_BHnd, ones], axis=-1), G_BHn, deg)
    y = normalise(read + intra)
    return rearrange(y, "B H g n d -> B n (H g) d").astype(v.dtype), RetentionState(S=S, z=z[..., 0])
