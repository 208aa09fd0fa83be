"""The oracle of the gated delta rule: the token-by-token recurrence
S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = scale S_t^T q_t (a reset clears S_{t-1};
`matrix_state.token_gates`), in float64 for float64 inputs."""

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from retention.ops.decay import decay_state
from retention.ops.matrix_state import compute_dtype, recurrence, token_gates


def _token(S, k_t, v_t, beta_t, decay_t):
    """(I - beta k k^T) (decay S) + beta k v^T."""
    S = decay_state(decay_t, S)
    error = v_t - jnp.einsum("bhd,bhde->bhe", k_t, S)
    return S + jnp.einsum("bhd,bhe->bhde", k_t, beta_t[..., None] * error)


def gated_delta_rule_recurrence(
    q: Float[Array, "B T Hq dk"],
    k: Float[Array, "B T H dk"],
    v: Float[Array, "B T H dv"],
    beta: Float[Array, "B T H"],
    log_g: Float[Array, "B T H"] | None = None,
    initial_state: Float[Array, "B H dk dv"] | None = None,
    *,
    segment_ids: Int[Array, "B T"] | None = None,
    scale: float | None = None,
) -> tuple[Float[Array, "B T Hq dv"], Float[Array, "B H dk dv"]]:
    """(o in v's dtype, the final state in the compute dtype), one token at a time from `initial_state`."""
    dtype = compute_dtype(q)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    tokens = token_gates(k, v, log_g, segment_ids, beta=beta, dtype=dtype)
    decay = tokens.decay()
    xs = (tokens.k, tokens.v, tokens.beta, decay)
    o, S = recurrence(_token, q, xs, initial_state, H=k.shape[2], d_v=v.shape[-1], scale=scale, dtype=dtype)
    return o.astype(v.dtype), S
