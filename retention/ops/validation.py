"""Checks at the public boundary of both ops (power retention and softmax attention): each raises ValueError or
TypeError naming the argument, the value and what is allowed, before any heavy work. Each op's own checks live in
its folder (`power_retention/validation.py`, `attention/validation.py`); the generic ones in `retention.validation`.
"""

import jax.numpy as jnp

from retention.validation import check_number

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
        raise ValueError(f"query heads must be a multiple of kv heads (GQA), got q heads {Hq} and k heads {k.shape[2]}")


def check_scale(scale) -> None:
    """scale is None (1/sqrt(d)) or a positive finite number."""
    if scale is not None:
        check_number("scale", scale, low=0.0, open_low=True)
