"""Resets and gates of power retention: the one preprocessing every path shares (XLA chunked, step, reference,
recurrence, context parallel, and the Pallas kernels' glue).

Per token t and kv-head (log_g None: 0; segment_ids None: one document):
- reset_t (the state carried into t is cleared): log_g_t <= LOG_G_ZERO (`retention/ops/decay.py`; -inf, or a
  gate whose float32 value exp(log_g_t) is exactly 0, where the recurrence multiplies the state by 0), or t > 0
  and segment_ids[b, t] != segment_ids[b, t-1] (a new document). Token 0 of a call never resets by segment ids;
- a_t, the finite log-gate: 0 at a reset, else log_g_t; NaN where log_g_t is positive or NaN (also at a reset: a
  document's first token, or token 0, with such a gate is poisoned), or where k_t or v_t has a non-finite entry.
  Those k_t, v_t become zeros, so the token's NaN travels only through a: it reaches that row and every later row
  of its document, and no masked product 0 * NaN reaches any other row.
Per chunk of c tokens (T padded to N*c with a = 0 and no reset):
- F_i: the inclusive sum of a from the chunk's start (the contract's), except that it is NaN from a NaN a_t of i's
  own document on, and a NaN of an earlier document does not enter it;
- R_i: the number of resets in the chunk up to i.
Every path reads F as an exponent <= 0 only where R_i == 0 or as a difference F_i - F_j within one document, so
an earlier document's gates cancel; F is a plain `cumsum`, whose sums share their rounding along the chunk, so the
differences between nearby tokens stay exact to float32 rounding (a tree of partial sums would not).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float, Int

from retention.ops.decay import LOG_G_ZERO
from retention.ops.segments import document_starts


class ChunkGates(NamedTuple):
    """k and v [B, T, H, d] with non-finite tokens zeroed; F [B, N, H, c] (float32, or float64 for float64 work) and
    R [B, N, H, c] int32, T padded to N*c."""

    k: Float[Array, "B T H d"]
    v: Float[Array, "B T H d"]
    F: Float[Array, "B N H c"]
    R: Int[Array, "B N H c"]


def _document_cumsum(a: Float[Array, "... c"], R: Int[Array, "... c"]) -> Float[Array, "... c"]:
    """The inclusive cumulative sum of a along the last axis with NaNs kept inside their document: NaN from the
    first NaN of a document (R, the reset count, names it) to its end; the sum skips NaNs."""
    last_nan_document = jax.lax.cummax(jnp.where(jnp.isnan(a), R, -1), axis=a.ndim - 1)
    F = jnp.cumsum(jnp.where(jnp.isnan(a), 0.0, a), axis=-1)
    return jnp.where(last_nan_document == R, jnp.nan, F)


def chunk_gates(
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    log_g: Float[Array, "B T H"] | None,
    segment_ids: Int[Array, "B T"] | None,
    *,
    chunk_size: int,
    dtype=jnp.float32,
) -> ChunkGates:
    """The per-token finite gates a and resets of (log_g, segment_ids), as per-chunk F and R, and k, v with their
    non-finite tokens zeroed (see the module docstring). chunk_size = T gives one chunk (the quadratic reference);
    chunk_size = 1 gives F = a and R = reset (the token recurrence). Inputs are assumed validated."""
    B, T, H = k.shape[:3]
    bad = ~(jnp.isfinite(k).all(-1) & jnp.isfinite(v).all(-1))  # [B, T, H]
    k, v = (jnp.where(bad[..., None], jnp.zeros((), x.dtype), x) for x in (k, v))
    log_g = jnp.zeros((B, T, H), dtype) if log_g is None else log_g.astype(dtype)
    reset = log_g <= LOG_G_ZERO
    if segment_ids is not None:
        reset = reset | document_starts(segment_ids)[..., None]
    a = jnp.where(reset, 0.0, log_g)
    a = jnp.where(bad | ~(log_g <= 0), jnp.nan, a)  # after the reset: a poisoned token (or gate) stays NaN
    c = chunk_size
    N = -(-T // c)
    pad = [(0, 0), (0, N * c - T), (0, 0)]
    a_BNHc = rearrange(jnp.pad(a, pad), "B (N c) H -> B N H c", c=c)
    reset_BNHc = rearrange(jnp.pad(reset, pad), "B (N c) H -> B N H c", c=c)
    R = jnp.cumsum(reset_BNHc.astype(jnp.int32), axis=-1)
    return ChunkGates(k=k, v=v, F=_document_cumsum(a_BNHc, R), R=R)
