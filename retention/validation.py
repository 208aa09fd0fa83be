"""Argument checks shared by every layer (ops, nn, data, train): each raises ValueError naming the argument, the
value and what is allowed. Op-specific checks (shapes, degree, chunk size, state) live with their op."""

import math
from collections.abc import Collection, Sequence

import jax
import numpy as np


def check_int(name: str, value, *, low: int = 1) -> None:
    """`value` must be an int (numpy ints too; bools are not ints here) >= low."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def check_number(
    name: str, value, *, low: float = -math.inf, high: float = math.inf, open_low: bool = False, open_high: bool = False
) -> None:
    """`value` must be a finite real number in [low, high]; open_low / open_high exclude that end (bools are not
    numbers)."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        ok = math.isfinite(value) and (value > low if open_low else value >= low)
        ok = ok and (value < high if open_high else value <= high)
    if not ok:
        opens = open_low or math.isinf(low), open_high or math.isinf(high)  # an infinite end is never allowed
        interval = f"{'(' if opens[0] else '['}{low}, {high}{')' if opens[1] else ']'}"
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")


def check_choice(name: str, value, allowed: Collection) -> None:
    """`value` must be one of `allowed`."""
    is_bool = isinstance(value, bool) and not any(isinstance(a, bool) for a in allowed)  # True == 1, but not here
    if is_bool or value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def concrete(x) -> np.ndarray | None:
    """x's value as a numpy array when it is known now, None when x is traced (under jit, grad, vmap...)."""
    return None if isinstance(x, jax.core.Tracer) else np.asarray(x)


def check_at_runtime(checks: Sequence[tuple[str, jax.Array, jax.Array]]) -> None:
    """For `debug_checks=True`: each check is (message with one {} for the value, flag, value), both computed on
    the device. When the computation runs (eagerly, or under jit and other transformations) a host callback raises
    ValueError(message.format(value)) for the first flag that is true; under jit it reaches the caller as a
    JaxRuntimeError whose text holds that message."""
    messages = tuple(message for message, _, _ in checks)

    def report(flags, values):
        for message, flag, value in zip(messages, flags, values):
            if np.any(flag):
                raise ValueError(message.format(np.asarray(value).max()))

    jax.debug.callback(report, [flag for _, flag, _ in checks], [value for _, _, value in checks])
