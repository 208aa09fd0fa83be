"""Checks at the public boundary of the ops: each raises ValueError or TypeError naming the argument, the value
and what is allowed, before any heavy work."""

import jax.numpy as jnp

FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.float64)


def check_qkv(q, k, v) -> None:
    """q [B, T, Hq, d], k and v [B, T, H, d], one floating dtype, Hq % H == 0."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name} must have rank 4 [B, T, heads, d], got shape {getattr(x, 'shape', None)}")
        if x.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float32, bfloat16, float16 or float64, got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape [B, T, H, d], got k {k.shape} and v {v.shape}")
    B, T, Hq, d = q.shape
    if k.shape[0] != B or k.shape[1] != T or k.shape[3] != d:
        raise ValueError(
            f"q {q.shape} and k {k.shape} must agree on batch, length and head dim ([B, T, Hq, d] vs [B, T, H, d])"
        )
    if T < 1:
        raise ValueError(f"q must hold at least one token, got T={T}")
    if Hq % k.shape[2]:
        raise ValueError(
            f"query heads must be a multiple of kv heads (GQA), got q heads {Hq} and k heads {k.shape[2]}"
        )


def check_deg(deg) -> None:
    """deg must be an even integer >= 2."""
    if isinstance(deg, bool) or not isinstance(deg, int) or deg < 2 or deg % 2:
        raise ValueError(f"deg must be an even integer >= 2 (2, 4, ...), got {deg!r}")


def check_log_g(log_g, k) -> None:
    """log_g is None or [B, T, H] like k's first three axes, floating."""
    if log_g is None:
        return
    if getattr(log_g, "shape", None) != tuple(k.shape[:3]):
        raise ValueError(f"log_g must have shape [B, T, H] = {tuple(k.shape[:3])}, got {getattr(log_g, 'shape', None)}")
    if log_g.dtype not in FLOAT_DTYPES:
        raise TypeError(f"log_g must be a floating dtype (float32 preferred), got {log_g.dtype}")


def check_scale(scale) -> None:
    """scale is None or a positive finite number."""
    if scale is not None and not (isinstance(scale, (int, float)) and 0 < scale < float("inf")):
        raise ValueError(f"scale must be None or a positive number, got {scale!r}")
