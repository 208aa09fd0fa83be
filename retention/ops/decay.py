"""The decay and reset arithmetic every chunked op shares (power retention and the matrix-state ops: linear
attention, GLA, the gated delta rule); each op turns its gates and segment ids into F and R its own way
(`power_retention/gates.py`, `matrix_state.py`).

Within a chunk (tokens on the last axis of F and R: F the cumulative log-gate, R the count of resets so far, F_end
and R_end their last entries), the reset contract:
- intra-chunk decay(i, j) = exp(F_i - F_j) if R_i == R_j, else 0 (j <= i);
- query i reads the state carried into the chunk, with the factor exp(F_i), if R_i == 0, else not at all;
- key j enters the state carried out, with the factor exp(F_end - F_j), if R_j == R_end, else not at all;
- the carried state decays by exp(F_end) if R_end == 0, else it is dropped.
Power retention takes the query and key factors to the power 1/p (exact, phi being p-homogeneous); the matrix-state
ops at p = 1. Every exponent is <= 0, so nothing overflows at any length. Masks are `where`s, never products with
0, so a NaN stays in the rows that see it.
"""

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

LOG_G_ZERO = -104.0  # exp(x) rounds to 0 in float32 below about -103.97: such a gate is a reset


def masked_exp(x: Float[Array, "..."], mask) -> Float[Array, "..."]:
    """exp(x) where mask, else 0; the exponent is masked too, so an unselected inf or NaN reaches no gradient.

    Args:
        x: the exponents.
        mask (Array): bool, broadcasting with x.

    Returns:
        exp(x) where mask, 0 elsewhere.
    """
    return jnp.where(mask, jnp.exp(jnp.where(mask, x, 0.0)), 0.0)


def gate_factors(F: Float[Array, "... c"], R: Int[Array, "... c"], deg: int):
    """The query factors, key factors and chunk decay of the module docstring.

    Args:
        F: the cumulative log-gates of each chunk [..., c].
        R: the reset counts [..., c].
        deg: the degree p the factors are taken to the power 1/p of (1 for the matrix-state ops).

    Returns:
        (tuple[Array, Array, Array]): query factors [..., c], exp(F/p) where R == 0; key factors [..., c],
            exp((F_end - F)/p) where R == R_end; the chunk decay [...], exp(F_end) where R_end == 0; 0 elsewhere.
    """
    F_end, R_end = F[..., -1:], R[..., -1:]
    decay = masked_exp(F_end, R_end == 0)[..., 0]
    return masked_exp(F / deg, R == 0), masked_exp((F_end - F) / deg, R == R_end), decay


def causal_decay(F: Float[Array, "... c"], R: Int[Array, "... c"]) -> Float[Array, "... c c"]:
    """The intra-chunk decay of the module docstring.

    Args:
        F: the cumulative log-gates of each chunk [..., c].
        R: the reset counts [..., c].

    Returns:
        [..., c, c]: exp(F_i - F_j) for j <= i in one document (R_i == R_j), else 0.
    """
    c = F.shape[-1]
    mask = jnp.tril(jnp.ones((c, c), dtype=bool)) & (R[..., :, None] == R[..., None, :])
    return masked_exp(F[..., :, None] - F[..., None, :], mask)


def decay_state(decay: Float[Array, "B H *r"], x: Float[Array, "B H ..."]) -> Float[Array, "B H ..."]:
    """A state decayed: decay * x, with a decay of 0 (a reset) dropping x outright, NaN included.

    Args:
        decay: per row and head [B, H], or with x's next axes too (GLA: per key row [B, H, d_k]).
        x: the state [B, H, ...].

    Returns:
        decay * x, broadcast over x's trailing axes; 0 where decay is 0.
    """
    decay = decay.reshape(decay.shape + (1,) * (x.ndim - decay.ndim))
    return jnp.where(decay == 0, 0.0, decay * x)


def combine_decayed(earlier: tuple, later: tuple) -> tuple:
    """Two consecutive segments of a decayed recurrence composed, (a, r, S) each: a the total log-decay
    [B, H, *r] (as `decay_state` takes), r whether the segment resets [B, H], S its state from empty [B, H, ...].
    The associative operator of the context-parallel scans (power retention, linear attention, GLA):
    (a_l + a_r, r_l or r_r, S_r if r_r else exp(a_r) S_l + S_r); its identity is zeros.

    Args:
        earlier: (a, r, S) of the earlier segment.
        later: (a, r, S) of the later one.

    Returns:
        (a, r, S) of the two together.
    """
    (a_l, r_l, S_l), (a_r, r_r, S_r) = earlier, later
    resets = r_r.reshape(r_r.shape + (1,) * (S_r.ndim - r_r.ndim))
    return a_l + a_r, r_l | r_r, jnp.where(resets, S_r, decay_state(jnp.exp(a_r), S_l) + S_r)
