"""Timing helpers shared by the benchmarks: medians after a warm-up, and this machine's matmul rate."""

import time

import jax
import jax.numpy as jnp
import numpy as np


def median_seconds(fn, *args, repeats: int = 3) -> float:
    """Median wall time of fn(*args) over `repeats` runs after one warm-up run (which also compiles)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def matmul_gflops(n: int = 4096, repeats: int = 5, dtype=jnp.float32) -> float:
    """Measured rate of one n x n x n matmul in GFLOP/s: the ceiling that achieved rates are compared with."""
    a, b = jax.random.normal(jax.random.key(0), (2, n, n), dtype)
    seconds = median_seconds(jax.jit(jnp.matmul), a, b, repeats=repeats)
    return 2 * n**3 / seconds / 1e9
