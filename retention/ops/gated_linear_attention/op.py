"""The public gated-linear-attention ops: the full op (training, prefill) and the step from a state (decode)."""

from jaxtyping import Array, Float, Int

from retention.ops.gated_linear_attention.chunked import gated_linear_attention_chunked
from retention.ops.matrix_state import check_args, check_matrix_state, step_chunk
from retention.ops.power_retention.validation import check_log_g, default_chunk_size

PREFERRED_CHUNK = 64


def _check_gates(log_g, k) -> None:
    if log_g is None:
        raise ValueError("log_g must be an array [B, T, H, d_k] of log-gates <= 0 (gated linear attention), got None")
    check_log_g(log_g, k, per_channel=True)


def gated_linear_attention(
    q: Float[Array, "B T Hq dk"],
    k: Float[Array, "B T H dk"],
    v: Float[Array, "B T H dv"],
    log_g: Float[Array, "B T H dk"],
    *,
    segment_ids: Int[Array, "B T"] | None = None,
    scale: float | None = None,
    chunk_size: int | None = None,
    initial_state: Float[Array, "B H dk dv"] | None = None,
    return_state: bool = False,
):
    """Causal gated linear attention (GLA, a decay per key channel): S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,
    o_t = scale S_t^T q_t, from S_0 = `initial_state` (None: zeros).

    q [B, T, Hq, d_k] (query head i reads kv-head i // (Hq // H)), k [B, T, H, d_k], v [B, T, H, d_v], log_g
    [B, T, H, d_k] <= 0 (a gate below LOG_G_ZERO, -inf included, empties its channel: exp is 0 in float32),
    segment_ids [B, T] int (the state resets where the id changes, never at token 0) or None; scale None is
    d_k^-0.5; chunk_size one of CHUNK_SIZES or None (64, or the smallest that holds T). Returns o [B, T, Hq, d_v]
    in v's dtype, or (o, state [B, H, d_k, d_v] float32) with `return_state`. A NaN or inf in q, k or v, or a NaN
    gate, gives NaN in that row and the later rows of its document.
    """
    scale = check_args(q, k, v, segment_ids, scale, chunk_size)
    _check_gates(log_g, k)
    B, T, _, d_k = q.shape
    if initial_state is not None:
        check_matrix_state(initial_state, B, k.shape[2], d_k, v.shape[-1], "initial_state")
    c = chunk_size or default_chunk_size(T, PREFERRED_CHUNK)
    options = dict(segment_ids=segment_ids, scale=scale, chunk_size=c)
    o, state = gated_linear_attention_chunked(q, k, v, log_g, initial_state, **options)
    return (o, state) if return_state else o


def gated_linear_attention_step(
    state: Float[Array, "B H dk dv"],
    q: Float[Array, "B n Hq dk"],
    k: Float[Array, "B n H dk"],
    v: Float[Array, "B n H dv"],
    log_g: Float[Array, "B n H dk"],
    *,
    segment_ids: Int[Array, "B n"] | None = None,
    scale: float | None = None,
    chunk_size: int | None = None,
) -> tuple[Float[Array, "B n Hq dv"], Float[Array, "B H dk dv"]]:
    """n >= 1 new tokens continuing `state`: row i of o equals row t0 + i of the full forward. Returns (o in v's
    dtype, the new state). Up to 16 tokens form one chunk against the state; more run in chunks (`step_chunk`).
    segment_ids [B, n] resets where the id changes inside the step; token 0 continues the state's document."""
    scale = check_args(q, k, v, segment_ids, scale, chunk_size)
    _check_gates(log_g, k)
    check_matrix_state(state, q.shape[0], k.shape[2], q.shape[-1], v.shape[-1], "state")
    c = step_chunk(q.shape[1], chunk_size, PREFERRED_CHUNK)
    return gated_linear_attention_chunked(q, k, v, log_g, state, segment_ids=segment_ids, scale=scale, chunk_size=c)
