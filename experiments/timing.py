"""Timing helpers shared by the benchmarks: wall times after a warm-up, their median, and this machine's matmul rate."""

import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np


def run_times(fn, *args, repeats: int = 3, warmups: int = 1) -> list[float]:
    """Wall seconds of each of `repeats` calls fn(*args), after `warmups` untimed calls (the first also compiles).
    Each call is waited for (jax.block_until_ready on its result; results that are not JAX arrays, e.g. torch's,
    pass through).

    Two warm-ups where the first call after compiling is slow: on XLA CPU at 64k tokens it took up to 4x the
    steady time (power retention's forward+backward: 42.9 s, then 10.3 s and 9.6 s; experiments/PERF_LOG.md), so
    the median of two timed calls after one warm-up reads 2.5x too slow."""
    for _ in range(warmups):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def median_seconds(fn, *args, repeats: int = 3, warmups: int = 1) -> float:
    """Median wall time of fn(*args) over `repeats` runs after `warmups` untimed runs (run_times)."""
    return float(np.median(run_times(fn, *args, repeats=repeats, warmups=warmups)))


def machine(note: str) -> dict:
    """The machine a benchmark ran on, for its JSON: the first device's kind, the platform, the CPU count, jax's
    version and the caller's `note` (e.g. what else was running)."""
    return {
        "device": jax.devices()[0].device_kind,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "jax_version": jax.__version__,
        "note": note,
    }


def matmul_gflops(n: int = 4096, repeats: int = 5, dtype=jnp.float32) -> float:
    """Measured rate of one n x n x n matmul in GFLOP/s: the ceiling that achieved rates are compared with."""
    a, b = jax.random.normal(jax.random.key(0), (2, n, n), dtype)
    seconds = median_seconds(jax.jit(jnp.matmul), a, b, repeats=repeats)
    return 2 * n**3 / seconds / 1e9
