"""Test set-up: float64 is on so oracles can run in double precision (paths under test get float32 inputs), and
XLA's CPU backend compiles at -O0 (`--xla_backend_optimization_level=0`, unless XLA_FLAGS already sets a level):
the suite is mostly compilation of small programs, and LLVM's optimisations cost more than they save there
(`make test` on 2 cores: 14 min 40 s at the default level, 10 min 31 s at 0). The HLO programs are the same;
only their machine code differs (and with it, at most, the order of float32 roundings). Set before JAX starts a
backend; the subprocesses the tests start (8-device files, trainer runs) inherit it."""

import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_backend_optimization_level" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_backend_optimization_level=0".strip()

import jax  # noqa: E402 (after XLA_FLAGS)

jax.config.update("jax_enable_x64", True)
