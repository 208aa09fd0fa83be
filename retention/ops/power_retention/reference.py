"""The oracles of power retention: the quadratic form in log space (DESIGN section 1) and the naive token-by-token
recurrence. Both compute in float64 when the inputs are float64, else float32; for tests and small inputs only.

Quadratic: s_ij = p * log(|scale q_i . k_j| + 1e-7) + G_i - G_j for j <= i in one document, the row max
subtracted, and 1e-6 added to the normaliser in that row-max space; O(T^2) memory, no state. A row whose plain
weights (scale q_i . k_j)^p exp(G_i - G_j) all round to 0 in the compute dtype is NaN, as on every path (its
normaliser is 0).
Recurrence: S_t = g_t S_{t-1} + phi(k_t) v_t^T, z_t = g_t z_{t-1} + phi(k_t), y_t = phi(q_t) S_t / phi(q_t) z_t,
one token at a time from an initial state; it returns the final state too. Its phi is built from the definition
(a gather of the monomials' factors), not by `sympow`, so it checks that too.
Both take resets and non-finite inputs as every path does (`gates.chunk_gates`): a reset (-inf gate, document
start) sets g_t = 0, so keys of an earlier document get no weight.
"""

from functools import cache
from itertools import combinations_with_replacement
from math import factorial, prod

import jax
import jax.numpy as jnp
import numpy as np
from einops import rearrange
from jaxtyping import Array, Float, Int

from retention.ops.decay import decay_state, gate_factors
from retention.ops.power_retention.chunk_math import normalise
from retention.ops.power_retention.gates import chunk_gates
from retention.ops.power_retention.state import RetentionState, augment, init_state, split, with_ones


def _compute_dtype(x):
    return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


def power_retention_reference(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    log_g: Float[Array, "B T H"] | None = None,
    *,
    segment_ids: Int[Array, "B T"] | None = None,
    deg: int = 2,
    scale: float | None = None,
) -> Float[Array, "B T Hq d"]:
    """The quadratic oracle: y_i = sum_{j<=i} w_ij v_j / sum_j w_ij with w_ij = (scale q_i.k_j)^deg * exp(G_i - G_j)
    for j in i's document (no reset in (j, i]), else 0. O(T^2) memory, float64 for float64 inputs.

    Args:
        q: queries [B, T, Hq, d].
        k: keys [B, T, H, d].
        v: values [B, T, H, d].
        log_g: log gates [B, T, H], <= 0, or None.
        segment_ids: int [B, T] or None, as in `power_retention`.
        deg: the even degree p >= 2.
        scale: None is d^-0.5.

    Returns:
        y [B, T, Hq, d] in v's dtype.
    """
    dtype = _compute_dtype(q)
    T, d = q.shape[1], q.shape[3]
    H = k.shape[2]
    scale = d**-0.5 if scale is None else scale
    gates = chunk_gates(k, v, log_g, segment_ids, chunk_size=T, dtype=dtype)  # one chunk: G and R over all of T
    G_BHT, R_BHT = gates.F[:, 0], gates.R[:, 0]
    q_BHgTd = rearrange(q.astype(dtype), "B T (H g) d -> B H g T d", H=H)
    k_BHTd = rearrange(gates.k.astype(dtype), "B T H d -> B H T d")
    v_BHTd = rearrange(gates.v.astype(dtype), "B T H d -> B H T d")
    qk = jnp.einsum("bhgid,bhjd->bhgij", q_BHgTd, k_BHTd)
    gate_BHgij = G_BHT[:, :, None, :, None] - G_BHT[:, :, None, None, :]
    logits = deg * jnp.log(jnp.abs(scale * qk) + 1e-7) + gate_BHgij
    same_document = R_BHT[:, :, :, None] == R_BHT[:, :, None, :]
    visible = jnp.tril(jnp.ones((T, T), dtype=bool)) & same_document[:, :, None]
    logits = jnp.where(visible, logits, -jnp.inf)
    weights = jnp.exp(logits - logits.max(axis=-1, keepdims=True))
    y = jnp.einsum("bhgij,bhjd->bhgid", weights, v_BHTd) / (weights.sum(axis=-1)[..., None] + 1e-6)
    plain = jnp.where(visible, (scale * qk) ** deg * jnp.exp(jnp.where(visible, gate_BHgij, 0.0)), 0.0)
    y = jnp.where((plain.sum(axis=-1) == 0)[..., None], jnp.nan, y)  # every weight rounds to 0: 0/0, NaN
    return rearrange(y, "B H g T d -> B T (H g) d").astype(v.dtype)


@cache
def _monomials(d: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """The factors [D, p] of each monomial of degree p in d variables (i1 <= ... <= ip, lexicographic: phi's
    order) and sqrt of its multinomial coefficient [D]."""
    factors = list(combinations_with_replacement(range(d), p))
    weights = [factorial(p) / prod(factorial(f.count(i)) for i in set(f)) for f in factors]
    return np.asarray(factors), np.sqrt(weights)


def _phi(x: Float[Array, "... d"], p: int) -> Float[Array, "... D"]:
    """phi(x) from its definition: each monomial's factors gathered and multiplied, times its weight."""
    factors, weights = _monomials(x.shape[-1], p)
    return jnp.prod(x[..., factors], axis=-1) * jnp.asarray(weights, x.dtype)


def _token(S_aug, q_BHgd, k_BHd, v_aug_BHe, a_BH, reset_BH, deg):
    """One token: read the decayed old state plus the new token's own term (q.k)^p [v|1] (exact, with no
    cancellation across features), then write the token. Returns (S_aug, y_aug [B, H, g, e]).

    a is the token's finite log-gate and reset its reset (`gates.chunk_gates` with chunks of one token): the decay
    is exp(a), or 0 at a reset; the own term and the token's write carry exp(a - a), 1 or the token's NaN, as the
    chunked forms do (so a poisoned token that starts a document poisons the rest of it)."""
    _, _, decay_BH = gate_factors(a_BH[..., None], reset_BH[..., None], deg)
    mark_BH = jnp.exp(a_BH - a_BH)
    own_BHg = jnp.einsum("bhgd,bhd->bhg", q_BHgd, k_BHd) ** deg * mark_BH[..., None]
    y_aug = decay_state(decay_BH, jnp.einsum("bhgD,bhDe->bhge", _phi(q_BHgd, deg), S_aug))
    y_aug = y_aug + own_BHg[..., None] * v_aug_BHe[:, :, None, :]
    write = jnp.einsum("bhD,bhe->bhDe", _phi(k_BHd, deg), v_aug_BHe) * mark_BH[..., None, None]
    S_aug = decay_state(decay_BH, S_aug) + write
    return S_aug, y_aug


def power_retention_recurrence(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    log_g: Float[Array, "B T H"] | None = None,
    initial_state: RetentionState | None = None,
    *,
    segment_ids: Int[Array, "B T"] | None = None,
    deg: int = 2,
    scale: float | None = None,
) -> tuple[Float[Array, "B T Hq d"], RetentionState]:
    """The recurrence over T tokens from `initial_state` (None: empty), a `lax.scan` over tokens, resetting at -inf
    gates and document starts. Returns (y in v's dtype, the final state in the compute dtype)."""
    dtype = _compute_dtype(q)
    B, d = q.shape[0], q.shape[3]
    H = k.shape[2]
    scale = d**-0.5 if scale is None else scale
    gates = chunk_gates(k, v, log_g, segment_ids, chunk_size=1, dtype=dtype)  # F = a and R = reset, per token
    q_TBHgd = rearrange(q.astype(dtype) * scale, "B T (H g) d -> T B H g d", H=H)
    k_TBHd = rearrange(gates.k.astype(dtype), "B T H d -> T B H d")
    v_f = gates.v.astype(dtype)
    v_TBHe = rearrange(with_ones(v_f), "B T H e -> T B H e")
    a_TBH, reset_TBH = (rearrange(x[..., 0], "B T H -> T B H") for x in (gates.F, gates.R))
    state = init_state(B, H, d, deg) if initial_state is None else initial_state
    S_aug = augment(RetentionState(*(x.astype(dtype) for x in state)))
    body = lambda S_aug, xs: _token(S_aug, *xs, deg)
    S_aug, y_aug = jax.lax.scan(body, S_aug, (q_TBHgd, k_TBHd, v_TBHe, a_TBH, reset_TBH))
    return rearrange(normalise(y_aug), "T B H g d -> B T (H g) d").astype(v.dtype), split(S_aug)
