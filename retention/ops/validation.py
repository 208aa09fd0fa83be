"""Checks at the public boundary of the ops (power retention, softmax attention, the matrix-state ops): each raises
ValueError or TypeError naming the argument, the value and what is allowed, before any heavy work. Each op's own
checks live beside it (`power_retention/validation.py`, `attention/validation.py`, `matrix_state.py`); the generic
ones in `retention.validation`.
`debug_checks=True` on an op adds the checks that need the values, run on the device (`runtime_input_checks`).
"""

import jax.numpy as jnp
import numpy as np

from retention.ops.chunking import CHUNK_SIZES
from retention.validation import check_choice, check_number, concrete

FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.float64)


def check_qkv(q, k, v, *, any_value_dim: bool = False) -> None:
    """q [B, T, Hq, d], k and v [B, T, H, d], one floating dtype, every size >= 1, Hq % H == 0; with
    `any_value_dim` v may be [B, T, H, d_v] of any d_v (the matrix-state ops)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name} must have rank 4 [B, T, heads, d], got shape {getattr(x, 'shape', None)}")
        if x.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float32, bfloat16, float16 or float64, got {x.dtype}")
        if min(x.shape) < 1:
            raise ValueError(f"{name} must have every size (B, T, heads, d) >= 1, got shape {x.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if any_value_dim and k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k [B, T, H, d_k] and v [B, T, H, d_v] must agree on B, T, H, got k {k.shape}, v {v.shape}")
    if not any_value_dim and k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape [B, T, H, d], got k {k.shape} and v {v.shape}")
    B, T, Hq, d = q.shape
    if k.shape[0] != B or k.shape[1] != T or k.shape[3] != d:
        raise ValueError(
            f"q {q.shape} and k {k.shape} must agree on batch, length and head dim ([B, T, Hq, d] vs [B, T, H, d])"
        )
    if Hq % k.shape[2]:
        raise ValueError(f"query heads must be a multiple of kv heads (GQA), got q heads {Hq} and k heads {k.shape[2]}")


def check_scale(scale) -> None:
    """scale is None (1/sqrt(d)) or a positive finite number."""
    if scale is not None:
        check_number("scale", scale, low=0.0, open_low=True)


def check_chunk_size(chunk_size) -> None:
    """Check a chunk size: None (the default for the length) or one of CHUNK_SIZES, an int (16.0 is not).

    Args:
        chunk_size (int | None): the chunk size to check.

    Raises:
        ValueError: when it is not.
    """
    if chunk_size is not None and not isinstance(chunk_size, (int, np.integer)):
        raise ValueError(f"chunk_size must be None or an int, one of {CHUNK_SIZES}, got {chunk_size!r}")
    check_choice("chunk_size", chunk_size, (None, *CHUNK_SIZES))


def check_log_g(log_g, k, *, per_channel: bool = False) -> None:
    """Check log-gates: None, or [B, T, H] like k's first three axes ([B, T, H, d_k] like k with `per_channel`),
    floating, and (when the values are known) <= 0 or NaN: -inf is a reset; a positive gate raises here, and gives
    NaN rows where the values are traced.

    Args:
        log_g (Array | None): the log-gates to check.
        k (Array): the keys [B, T, H, d_k] they gate.
        per_channel: a gate per key channel (GLA) rather than per kv-head.

    Raises:
        ValueError: a wrong shape, or a known positive gate.
        TypeError: a dtype that is not floating.
    """
    if log_g is None:
        return
    shape, axes = (tuple(k.shape), "[B, T, H, d_k]") if per_channel else (tuple(k.shape[:3]), "[B, T, H]")
    if getattr(log_g, "shape", None) != shape:
        raise ValueError(f"log_g must have shape {axes} = {shape}, got {getattr(log_g, 'shape', None)}")
    if log_g.dtype not in FLOAT_DTYPES:
        raise TypeError(f"log_g must be a floating dtype (float32 preferred), got {log_g.dtype}")
    values = concrete(log_g)
    if values is not None and (values > 0).any():
        where = tuple(int(i) for i in np.argwhere(values > 0)[0])
        raise ValueError(
            f"log_g must be <= 0 (a log-gate; -inf is a reset), got {float(values[where])} at index {where}"
        )


def _reappearing_ids(segment_ids) -> np.ndarray:
    """Per row, the number of ids that come back after another id (0 when each document is contiguous in time):
    distinct ids minus 1 minus the number of changes, negated (works on numpy and jax arrays alike)."""
    xp = np if isinstance(segment_ids, np.ndarray) else jnp
    changes = (segment_ids[:, 1:] != segment_ids[:, :-1]).sum(axis=1)
    ordered = xp.sort(segment_ids, axis=1)
    distinct = 1 + (ordered[:, 1:] != ordered[:, :-1]).sum(axis=1)
    return changes + 1 - distinct


def check_segment_ids(segment_ids, B: int, T: int, name: str = "segment_ids") -> None:
    """segment_ids is None (one document per row) or an integer array [B, T]: equal ids form one document, and
    each document is contiguous in time (checked when the values are known: an id may not come back)."""
    if segment_ids is None:
        return
    shape, dtype = getattr(segment_ids, "shape", None), getattr(segment_ids, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"{name} must be an integer array [B, T] (int32), got {dtype or type(segment_ids).__name__}")
    if tuple(shape) != (B, T):
        raise ValueError(f"{name} must have shape [B, T] = {(B, T)}, got {tuple(shape)}")
    values = concrete(segment_ids)
    if values is not None and T > 1 and (_reappearing_ids(values) > 0).any():
        row = int(np.argmax(_reappearing_ids(values) > 0))
        raise ValueError(
            f"{name} must keep each document contiguous in time (an id may not come back after another), got row "
            f"{row}: {values[row].tolist()[:64]}"
        )


def runtime_input_checks(arrays: dict, segment_ids=None) -> list:
    """The `debug_checks` list (see `retention.validation.check_at_runtime`) for named floating arrays (each must
    be finite) and segment ids (documents contiguous)."""
    checks = []
    for name, x in arrays.items():
        if x is not None:
            count = jnp.sum(~jnp.isfinite(x))
            checks.append((f"{name} must be finite (debug_checks), got {{}} NaN or inf entries", count > 0, count))
    if segment_ids is not None and segment_ids.shape[1] > 1:
        reappearing = jnp.max(_reappearing_ids(segment_ids))
        message = "segment_ids must keep each document contiguous in time (debug_checks), got {} ids coming back"
        checks.append((message, reappearing > 0, reappearing))
    return checks
