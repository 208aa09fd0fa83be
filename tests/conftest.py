"""Test set-up: float64 is on so oracles can run in double precision (paths under test get float32 inputs), and
XLA's CPU backend compiles at -O0 (`--xla_backend_optimization_level=0`, unless XLA_FLAGS already sets a level):
the suite is mostly compilation of small programs, and LLVM's optimisations cost more than they save there
(`make test` on 2 cores: 14 min 40 s at the default level, 10 min 31 s at 0). The HLO programs are the same;
only their machine code differs (and with it, at most, the order of float32 roundings).

One run of the suite shares JAX's persistent compilation cache (a fresh temporary folder, removed at the end):
its xdist workers and the processes the tests start (8-device files, `train.py` runs) compile many identical
programs (the same tiny trainer config in every run-folder test, the same layer in many model tests), and a
program met again is read back instead of compiled. The cache is keyed on the program, the flags and the
devices, so what runs is what would have been compiled. Both are set before JAX starts a backend, through the
environment, so the subprocesses inherit them."""

import os
import shutil
import tempfile

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_backend_optimization_level" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_backend_optimization_level=0".strip()

_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ  # the first process of the run (xdist's controller)
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="retention-tests-xla-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402 (after the environment)

jax.config.update("jax_enable_x64", True)


def pytest_unconfigure(config):
    """The process that made the run's compilation cache removes it."""
    if _OWN_CACHE:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
