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
from jaxtyping import Array, Float, Int

from retention.ops.decay import causal_decay, decay_state, gate_factors, masked_exp
from retention.ops.power_retention.chunk_math import intra_chunk, normalise, state_read, state_write
from retention.ops.power_retention.gates import chunk_gates
from retention.ops.power_retention.state import RetentionState, augment, split, with_ones
from retention.ops.power_retention.sympow import sympow

StatePass = Callable[..., tuple[Array, Array]]  # (q~ [B,H,m,d], k~ [B,H,n,d], u [B,H,n,e], gamma [B,H], S) -> (read, S)


def xla_state_pass(q_t, k_t, u, gamma, S, *, deg: int):
    """(phi(q~) S [B, H, m, e], gamma S + phi(k~)^T u [B, H, D, e]) for q~ [B, H, m, d], k~ [B, H, n, d],
    u [B, H, n, e], gamma [B, H] and S [B, H, D, e]: the read, then the update (gamma 0, a reset, drops S).

    The barrier orders the update after the read, so it happens in place (without it XLA copies S every step,
    twice the bytes per token)."""
    read, S = jax.lax.optimization_barrier((state_read(q_t, S, deg), S))
    return read, decay_state(gamma, S) + state_write(k_t, u, deg)


def chunk_step(
    state: RetentionState,
    q: Float[Array, "B n Hq d"],
    k: Float[Array, "B n H d"],
    v: Float[Array, "B n H d"],
    log_g: Float[Array, "B n H"] | None,
    *,
    segment_ids: Int[Array, "B n"] | None = None,
    deg: int,
    scale: float,
    state_pass: StatePass | None = None,
) -> tuple[Float[Array, "B n Hq d"], RetentionState]:
    """n >= 1 new tokens as one chunk against `state`; returns (y [B, n, Hq, d] in v's dtype, the updated state).

    Row i reads phi(q_i exp(F_i / p)) . (S, z) while no reset precedes it in the chunk, F_i the gates of tokens
    1..i, plus the chunk's own keys of its document directly: (q_i . k_j)^p exp(F_i - F_j) (`chunk_math`; resets
    at -inf gates and at changes of segment_ids after token 0). S and z are kept apart (no [S | z] copy per call,
    which costs more than the step itself at decode). `state_pass` computes the read and update of S (default:
    XLA, `xla_state_pass`); z's always runs in XLA."""
    H, n = k.shape[2], k.shape[1]
    f32 = jnp.float32
    gates = chunk_gates(k, v, log_g, segment_ids, chunk_size=n)
    q_BHgnd = rearrange(q.astype(f32) * scale, "B n (H g) d -> B H g n d", H=H)
    k_BHnd = rearrange(gates.k.astype(f32), "B n H d -> B H n d")
    v_BHnd = rearrange(gates.v.astype(f32), "B n H d -> B H n d")
    F_BHn, R_BHn = gates.F[:, 0], gates.R[:, 0]
    fq_BHn, fk_BHn, gamma_BH = gate_factors(F_BHn, R_BHn, deg)
    q_t = rearrange(q_BHgnd * fq_BHn[:, :, None, :, None], "B H g n d -> B H (g n) d")
    k_t = k_BHnd * fk_BHn[..., None]
    ones = jnp.ones(v_BHnd.shape[:-1] + (1,), f32)

    read_S, S = (state_pass or partial(xla_state_pass, deg=deg))(q_t, k_t, v_BHnd, gamma_BH, state.S)
    read_z, z = xla_state_pass(q_t, k_t, ones, gamma_BH, state.z[..., None], deg=deg)
    read = rearrange(jnp.concatenate([read_S, read_z], axis=-1), "B H (g n) e -> B H g n e", n=n)
    read = jnp.where((R_BHn == 0)[:, :, None, :, None], read, 0.0)  # rows after a reset do not read the state
    intra = intra_chunk(q_BHgnd, k_BHnd, with_ones(v_BHnd), F_BHn, R_BHn, deg)
    y = normalise(read + intra)
    return rearrange(y, "B H g n d -> B n (H g) d").astype(v.dtype), RetentionState(S=S, z=z[..., 0])


def chunk_states(
    state: RetentionState,
    k: Float[Array, "B n H d"],
    v: Float[Array, "B n H d"],
    log_g: Float[Array, "B n H"] | None,
    *,
    segment_ids: Int[Array, "B n"] | None = None,
    deg: int,
) -> RetentionState:
    """The state after each of n new tokens, from the one chunk (no stepping): S [n, B, H, D, d] and z [n, B, H, D],
    entry i the state after tokens 0..i, equal to `chunk_step`'s state after those i + 1 tokens (float32 rounding).

    S_i = exp(F_i) S (if no reset precedes token i in the chunk) + sum_{j <= i, one document} exp(F_i - F_j)
    phi(k_j) v_j^T, with F, R the chunk's cumulative gates and resets (`chunk_math`'s contract); z likewise with
    v = 1. It holds n copies of the state: n D (d + 1) float32 per kv-head (d = 64, deg 2: D = 2080, 528 KiB
    per head and token, 2.6 MiB per head for a verify step of k = 4 drafts, n = 5 tokens)."""
    n = k.shape[1]
    gates = chunk_gates(k, v, log_g, segment_ids, chunk_size=n)
    phi_BHDn = sympow(rearrange(gates.k.astype(jnp.float32), "B n H d -> B H d n"), deg, axis=-2)
    u_BHne = with_ones(rearrange(gates.v.astype(jnp.float32), "B n H d -> B H n d"))
    F_BHn, R_BHn = gates.F[:, 0], gates.R[:, 0]
    written = jnp.einsum("bhij,bhDj,bhje->ibhDe", causal_decay(F_BHn, R_BHn), phi_BHDn, u_BHne)
    carried_nBH = rearrange(masked_exp(F_BHn, R_BHn == 0), "B H n -> n B H")
    return split(jax.vmap(decay_state, in_axes=(0, None))(carried_nBH, augment(state)) + written)
