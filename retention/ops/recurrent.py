"""The recurrent form of power retention: a constant-size state, decode steps, and a token-by-token scan.

S_t = g_t S_{t-1} + phi(k_t) v_t^T and z_t = g_t z_{t-1} + phi(k_t); y_t = phi(scale q_t) S_t / phi(scale q_t) z_t.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float

from retention.ops.sympow import sympow, sympow_dim



class RetentionState(NamedTuple):
    """The fixed-size memory of power retention, per batch row and kv-head (float32)."""

    S: Float[Array, "B H D d"]
    z: Float[Array, "B H D"]


def init_state(batch: int, heads: int, head_dim: int, deg: int = 2) -> RetentionState:
    """An empty state: S [batch, heads, D, head_dim] and z [batch, heads, D], zeros, float32."""
    D = sympow_dim(head_dim, deg)
    return RetentionState(
        S=jnp.zeros((batch, heads, D, head_dim), jnp.float32), z=jnp.zeros((batch, heads, D), jnp.float32)
    )


def normalise(y_aug: Float[Array, "... e"]) -> Float[Array, "... d"]:
    """Numerator columns over the last (normaliser) column; a row whose weights are all zero (padding, or every
    weight underflowed) gives 0, and a NaN-free gradient, instead of 0/0."""
    num, den = y_aug[..., :-1], y_aug[..., -1:]
    positive = den > 0
    return jnp.where(positive, num / jnp.where(positive, den, 1.0), 0.0)


def causal_decay(G: Float[Array, "... c"]) -> Float[Array, "... c c"]:
    """exp(G_i - G_j) for j <= i, else 0, from inclusive cumulative log-gates G (every exponent <= 0)."""
    c = G.shape[-1]
    causal = jnp.tril(jnp.ones((c, c), dtype=bool))
    return jnp.where(causal, jnp.exp(jnp.where(causal, G[..., :, None] - G[..., None, :], 0.0)), 0.0)


def augment(state: RetentionState) -> Float[Array, "B H D e"]:
    """S with z appended as its last column: [B, H, D, d+1], so one matmul reads numerator and normaliser."""
    return jnp.concatenate([state.S, state.z[..., None]], axis=-1)


def split(S_aug: Float[Array, "B H D e"]) -> RetentionState:
    """Inverse of `augment`."""
    return RetentionState(S=S_aug[..., :-1], z=S_aug[..., -1])


def _step_tokens(S_aug, q_BHgd, k_BHd, v_aug_BHe, log_g_BH, deg):
    """One token: read the decayed old state plus the new token's own term (q.k)^p [v|1] (exact, with no
    cancellation across features), then write the token. Returns (S_aug, y_aug [B, H, g, e])."""
    decay_BH = jnp.exp(log_g_BH)
    own_BHg = jnp.einsum("bhgd,bhd->bhg", q_BHgd, k_BHd) ** deg
    y_aug = decay_BH[..., None, None] * jnp.einsum("bhgD,bhDe->bhge", sympow(q_BHgd, deg), S_aug)
    y_aug = y_aug + own_BHg[..., None] * v_aug_BHe[:, :, None, :]
    S_aug = decay_BH[..., None, None] * S_aug + jnp.einsum("bhD,bhe->bhDe", sympow(k_BHd, deg), v_aug_BHe)
    return S_aug, y_aug


def chunk_step(state: RetentionState, q, k, v, log_g, *, deg: int, scale: float):
    """n >= 1 new tokens as one chunk against `state`, with S and z kept apart (no [S | z] copy per call, which
    costs more than the step itself at decode). Returns (y [B, n, Hq, d] in v's dtype, the updated state).

    Row i reads phi(q_i exp(G_i / p)) . (S, z), G_i the gates of tokens 1..i of the chunk, plus the chunk's own
    keys directly: (q_i . k_j)^p exp(G_i - G_j) for j <= i.
    """
    H = k.shape[2]
    f32 = jnp.float32
    q_BHgnd = rearrange(q.astype(f32) * scale, "B n (H g) d -> B H g n d", H=H)
    k_BHnd = rearrange(k.astype(f32), "B n H d -> B H n d")
    v_BHnd = rearrange(v.astype(f32), "B n H d -> B H n d")
    n = k.shape[1]
    log_g = jnp.zeros(k.shape[:3], f32) if log_g is None else log_g.astype(f32)
    G_BHn = jnp.cumsum(rearrange(log_g, "B n H -> B H n"), axis=-1)
    G_end_BH = G_BHn[..., -1]

    phi_q = sympow(q_BHgnd * jnp.exp(G_BHn / deg)[:, :, None, :, None], deg)
    A = jnp.einsum("bhgid,bhjd->bhgij", q_BHgnd, k_BHnd) ** deg * causal_decay(G_BHn)[:, :, None]
    num = jnp.einsum("bhgnD,bhDd->bhgnd", phi_q, state.S) + jnp.einsum("bhgij,bhjd->bhgid", A, v_BHnd)
    den = jnp.einsum("bhgnD,bhD->bhgn", phi_q, state.z) + A.sum(-1)
    y = normalise(jnp.concatenate([num, den[..., None]], axis=-1))
    # The barrier orders the in-place update after the read; without it XLA copies S every step (2x per token).
    y, S_old, z_old = jax.lax.optimization_barrier((y, state.S, state.z))

    phi_k = sympow(k_BHnd * jnp.exp((G_end_BH[..., None] - G_BHn) / deg)[..., None], deg)
    decay_BH = jnp.exp(G_end_BH)
    S = decay_BH[..., None, None] * S_old + jnp.einsum("bhnD,bhnd->bhDd", phi_k, v_BHnd)
    z = decay_BH[..., None] * z_old + phi_k.sum(axis=2)
    return rearrange(y, "B H g n d -> B n (H g) d").astype(v.dtype), RetentionState(S=S, z=z)


def recurrent_scan(q, k, v, log_g, state: RetentionState, *, deg: int, scale: float):
    """Token-by-token recurrence over [B, n, ...] inputs from `state`; returns (y [B, n, Hq, d] float32, state).

    Row i gets the gates of tokens t0+1 .. t0+i applied to the state and to the new keys before it, so several
    tokens at once (speculative or chunked decode) equal the same tokens one at a time.
    """
    H = k.shape[2]
    f32 = jnp.float32
    q_nBHgd = rearrange(q.astype(f32) * scale, "B n (H g) d -> n B H g d", H=H)
    k_nBHd = rearrange(k.astype(f32), "B n H d -> n B H d")
    v_f = v.astype(f32)
    v_aug = jnp.concatenate([v_f, jnp.ones(v_f.shape[:-1] + (1,), f32)], axis=-1)
    v_nBHe = rearrange(v_aug, "B n H e -> n B H e")
    if log_g is None:
        log_g = jnp.zeros(k.shape[:3], f32)
    g_nBH = rearrange(log_g.astype(f32), "B n H -> n B H")

    def body(S_aug, xs):
        return _step_tokens(S_aug, *xs, deg)

    S_aug, y_aug = jax.lax.scan(body, augment(state), (q_nBHgd, k_nBHd, v_nBHe, g_nBH))
    return rearrange(normalise(y_aug), "n B H g d -> B n (H g) d"), split(S_aug)
