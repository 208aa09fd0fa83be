"""The oracle of gated linear attention: the token-by-token recurrence S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,
o_t = scale S_t^T q_t (a reset clears S_{t-1}; `matrix_state.token_gates`), in float64 for float64 inputs."""

from jaxtyping import Array, Float, Int

from retention.ops.matrix_state import compute_dtype, decayed_write, recurrence, token_gates


def gated_linear_attention_recurrence(
    q: Float[Array, "B T Hq dk"],
    k: Float[Array, "B T H dk"],
    v: Float[Array, "B T H dv"],
    log_g: Float[Array, "B T H dk"],
    initial_state: Float[Array, "B H dk dv"] | None = None,
    *,
    segment_ids: Int[Array, "B T"] | None = None,
    scale: float | None = None,
) -> tuple[Float[Array, "B T Hq dv"], Float[Array, "B H dk dv"]]:
    """(o in v's dtype, the final state in the compute dtype), one token at a time from `initial_state`."""
    dtype = compute_dtype(q)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    tokens = token_gates(k, v, log_g, segment_ids, per_channel=True, dtype=dtype)
    decay = tokens.decay()  # [B, T, H, dk]: row m of S decays by exp(g_t[m])
    xs = (tokens.k, tokens.v, decay)
    o, S = recurrence(decayed_write, q, xs, initial_state, H=k.shape[2], d_v=v.shape[-1], scale=scale, dtype=dtype)
    return o.astype(v.dtype), S
