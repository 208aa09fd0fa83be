"""The power-retention op's own argument checks and the values they allow (the shared q, k, v and scale checks are
in `retention/ops/validation.py`, the generic ones in `retention.validation`). Each raises ValueError or TypeError
naming the argument, the value and what is allowed."""

import jax.numpy as jnp
import numpy as np

from retention.ops.validation import FLOAT_DTYPES, check_qkv, check_scale, check_segment_ids
from retention.validation import check_choice, concrete

RETENTION_IMPLS = ("auto", "xla", "pallas", "reference")
"""The `impl` values of `power_retention`."""
STATE_IMPLS = ("auto", "xla", "pallas")  # the impls that carry a state: the decode step, context parallelism
CHUNK_SIZES = (16, 32, 64, 128, 256, 512, 1024)
"""The `chunk_size` values of the chunked ops (power retention and the matrix-state ops)."""
DEFAULT_CHUNK_SIZE = 128  # fastest measured on CPU at d=64 (experiments/PERF_LOG.md)


def default_chunk_size(T: int, preferred: int = DEFAULT_CHUNK_SIZE) -> int:
    """`preferred` (128), or the smallest allowed chunk that holds all of a shorter sequence."""
    return next((c for c in CHUNK_SIZES if c >= min(T, preferred)), preferred)


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


def check_deg(deg) -> None:
    """Check a degree: an even integer >= 2 (numpy ints too; bools are not ints here).

    Args:
        deg (int): the degree to check.

    Raises:
        ValueError: when it is not.
    """
    if isinstance(deg, bool) or not isinstance(deg, (int, np.integer)) or deg < 2 or deg % 2:
        raise ValueError(f"deg must be an even integer >= 2 (2, 4, ...), got {deg!r}")


def check_log_g(log_g, k, *, per_channel: bool = False) -> None:
    """log_g is None or [B, T, H] like k's first three axes ([B, T, H, d_k] like k with `per_channel`), floating,
    and (when its values are known) <= 0 or NaN: -inf is a reset; a positive gate raises here, and gives NaN rows
    where the values are traced."""
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


def runtime_gate_checks(log_g) -> list:
    """The `debug_checks` entry of log_g: no positive or NaN gate (see `retention.validation.check_at_runtime`)."""
    if log_g is None:
        return []
    count = jnp.sum(~(log_g <= 0))
    return [("log_g must be <= 0 and not NaN (debug_checks), got {} positive or NaN entries", count > 0, count)]


def check_op_args(q, k, v, log_g, segment_ids, deg, scale, chunk_size, impl, impls) -> float:
    """The checks the full op, its step and its context-parallel form share; returns the resolved scale (1/sqrt(d)
    for None)."""
    check_qkv(q, k, v)
    check_deg(deg)
    check_log_g(log_g, k)
    check_segment_ids(segment_ids, *q.shape[:2])
    check_scale(scale)
    check_chunk_size(chunk_size)
    check_choice("impl", impl, impls)
    return q.shape[-1] ** -0.5 if scale is None else float(scale)
