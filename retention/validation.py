"""Argument checks shared by every layer (ops, nn, data, train): each raises ValueError naming the argument, the
value and what is allowed. Op-specific checks (shapes, degree, chunk size, state) live with their op."""

import math
from collections.abc import Collection

import numpy as np


def check_int(name: str, value, *, low: int = 1) -> None:
    """`value` must be an int (numpy ints too; bools are not ints here) >= low."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def check_number(name: str, value, *, low: float = -math.inf, high: float = math.inf, open_low: bool = False) -> None:
    """`value` must be a finite real number in [low, high] ((low, high] with open_low; bools are not numbers)."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        ok = math.isfinite(value) and (value > low if open_low else value >= low) and value <= high
    if not ok:
        interval = f"{'(' if open_low else '['}{low}, {high}]"
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")


def check_choice(name: str, value, allowed: Collection) -> None:
    """`value` must be one of `allowed`."""
    is_bool = isinstance(value, bool) and not any(isinstance(a, bool) for a in allowed)  # True == 1, but not here
    if is_bool or value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
