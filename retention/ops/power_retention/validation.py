"""The power-retention op's own argument checks and the values they allow (the shared q, k, v, gate, scale and
chunk size checks are in `retention/ops/validation.py`, the generic ones in `retention.validation`). Each raises
ValueError or TypeError naming the argument, the value and what is allowed."""

import jax.numpy as jnp
import numpy as np

from retention.ops.validation import check_chunk_size, check_log_g, check_qkv, check_scale, check_segment_ids
from retention.validation import check_choice

RETENTION_IMPLS = ("auto", "xla", "pallas", "reference")
"""The `impl` values of `power_retention`."""
STATE_IMPLS = ("auto", "xla", "pallas")  # the impls that carry a state: the decode step, context parallelism


def check_deg(deg) -> None:
    """Check a degree: an even integer >= 2 (numpy ints too; bools are not ints here).

    Args:
        deg (int): the degree to check.

    Raises:
        ValueError: when it is not.
    """
    if isinstance(deg, bool) or not isinstance(deg, (int, np.integer)) or deg < 2 or deg % 2:
        raise ValueError(f"deg must be an even integer >= 2 (2, 4, ...), got {deg!r}")


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
