"""The public gated-linear-attention ops: the full op (training, prefill) and the step from a state (decode).

impl = "xla" | "pallas" (GLA_IMPLS; no "auto" rule, so "xla" is the default):
- "xla": the chunked form in plain JAX (`chunked.py`), on every backend;
- "pallas": the Pallas kernels (`pallas.py`, forward and backward), interpreted on CPU; raises ValueError for the
  shapes they do not support (on GPU: d_k, d_v and the chunk powers of two >= 16, query heads per kv-head a power
  of two). Under a mesh they run in a
  shard_map over its batch and head axes (`matrix_state.kernels_on_mesh`).
Both take the same gates, resets and initial state, and give NaN where a bad token poisons its document.
"""

from jaxtyping import Array, Float, Int

from retention.ops.gated_linear_attention.chunked import gated_linear_attention_chunked
from retention.ops.gated_linear_attention.pallas import gated_linear_attention_pallas
from retention.ops.matrix_state import full_op, step_op
from retention.ops.validation import check_log_g
from retention.validation import check_choice

PREFERRED_CHUNK = 64
GLA_IMPLS = ("xla", "pallas")
_CHUNKED = {"xla": gated_linear_attention_chunked, "pallas": gated_linear_attention_pallas}


def _chunked(impl: str):
    """The chunked path of `impl` (one of GLA_IMPLS)."""
    check_choice("impl", impl, GLA_IMPLS)
    return _CHUNKED[impl]


def _check_gates(k, log_g) -> None:
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
    impl: str = "xla",
):
    """Causal gated linear attention (GLA, a decay per key channel): S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,
    o_t = scale S_t^T q_t, from S_0 = `initial_state` (None: zeros).

    A NaN or inf in q, k or v, or a NaN gate, gives NaN in that row and the later rows of its document.

    Args:
        q: queries [B, T, Hq, d_k]; query head i reads kv-head i // (Hq // H).
        k: keys [B, T, H, d_k].
        v: values [B, T, H, d_v].
        log_g: log decays per key channel [B, T, H, d_k], <= 0 (a gate below LOG_G_ZERO, -inf included, empties its
            channel: exp is 0 in float32).
        segment_ids: int [B, T]: the state resets where the id changes, never at token 0. None: one document.
        scale: None is d_k^-0.5.
        chunk_size: one of CHUNK_SIZES, or None (64, or the smallest that holds T).
        initial_state: S_0 [B, H, d_k, d_v] float32, or None.
        return_state: also return the state after the last token.
        impl: one of GLA_IMPLS: "xla" (chunked, plain JAX) or "pallas" (the kernels; interpreted on CPU).

    Returns:
        (Array | tuple[Array, Array]): o [B, T, Hq, d_v] in v's dtype; with `return_state` the pair (o, state), state
            [B, H, d_k, d_v] float32.
    """
    return full_op(
        _chunked(impl),
        PREFERRED_CHUNK,
        _check_gates,
        q,
        k,
        v,
        (log_g,),
        segment_ids=segment_ids,
        scale=scale,
        chunk_size=chunk_size,
        initial_state=initial_state,
        return_state=return_state,
    )


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
    impl: str = "xla",
) -> tuple[Float[Array, "B n Hq dv"], Float[Array, "B H dk dv"]]:
    """n >= 1 new tokens continuing `state`: row i of o equals row t0 + i of the full forward.

    Up to 16 tokens form one chunk against the state; more run in chunks (`step_chunk`).

    Args:
        state: S after the tokens before these [B, H, d_k, d_v] float32 (`init_matrix_state` for none).
        q: queries [B, n, Hq, d_k].
        k: keys [B, n, H, d_k].
        v: values [B, n, H, d_v].
        log_g: log decays per key channel [B, n, H, d_k], <= 0.
        segment_ids: int [B, n]: resets where the id changes inside the step; token 0 continues the state's document.
        scale: None is d_k^-0.5.
        chunk_size: as in `gated_linear_attention`.
        impl: as in `gated_linear_attention`.

    Returns:
        o: [B, n, Hq, d_v] in v's dtype.
        state: the new state [B, H, d_k, d_v].
    """
    return step_op(
        _chunked(impl),
        PREFERRED_CHUNK,
        _check_gates,
        state,
        q,
        k,
        v,
        (log_g,),
        segment_ids=segment_ids,
        scale=scale,
        chunk_size=chunk_size,
    )
