"""Test set-up: float64 is on so oracles can run in double precision (paths under test get float32 inputs), and
XLA's CPU backend compiles at -O0 (`--xla_backend_optimization_level=0`, unless XLA_FLAGS already sets a level):
the suite is mostly compilation of small programs, and LLVM's optimisations cost more than they save there
(`make test` on 2 cores: 14 min 40 s at the default level, 10 min 31 s at 0). The HLO programs are the same;
only their machine code differs (and with it, at most, the order of float32 roundings). Set before JAX starts a
backend; the subprocesses the tests start (8-device files, trainer runs) inherit it."""

import gc
import os
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression  # pytest's own parser of -m (pytest is held below 9 in pyproject)

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_backend_optimization_level" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_backend_optimization_level=0".strip()

import jax  # noqa: E402 (after XLA_FLAGS)

jax.config.update("jax_enable_x64", True)


def _memory_maps() -> int:
    """The memory maps of this process (Linux; 0 where /proc is missing)."""
    try:
        with open(f"/proc/{os.getpid()}/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return 0


def _map_limit() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return 65530  # Linux's default


CLEAR_AT_MAPS = _map_limit() // 2


def pytest_runtest_teardown(item, nextitem):
    """Every compiled CPU program holds about 6 memory maps until JAX drops it, and a process past the kernel's
    vm.max_map_count (65530 by default) segfaults in its next compile: a pytest worker compiles over 10,000 programs
    in a run. So once this process holds half the limit, JAX's caches are cleared (their programs compile again
    when next called)."""
    if _memory_maps() > CLEAR_AT_MAPS:
        jax.clear_caches()


def pytest_collection_finish(session):
    """Python's cyclic garbage collector walks every tracked object at each full collection, and a worker holds
    millions (JAX's traces and compiled programs): 3-4% of a run went to it. So what collection built is frozen
    (never walked again) and full collections come 5x more rarely."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 50)


# Folders whose every test is an integration test: they import lm-eval (tests/eval) and torch with transformers'
# models (tests/hf), which the `test` extra (make test) does not install.
INTEGRATION_ONLY = tuple(Path(__file__).parent / name for name in ("eval", "hf"))


def _selects_integration(config) -> bool:
    """Whether the run's -m selects a test marked integration, or integration and slow (no -m selects all)."""
    markexpr = config.getoption("markexpr")
    if not markexpr:
        return True
    expression = Expression.compile(markexpr)
    has = lambda marks: lambda name, **_: name in marks
    return expression.evaluate(has({"integration"})) or expression.evaluate(has({"integration", "slow"}))


def pytest_ignore_collect(collection_path, config):
    """A run that leaves the integration tests out (make test) does not import INTEGRATION_ONLY's folders, so it runs
    without their libraries; it would deselect all of their tests anyway."""
    if collection_path in INTEGRATION_ONLY and not _selects_integration(config):
        return True
    return None


RUN_FIRST = ("tests/parallel/test_eight_devices.py", "tests/experiments/test_protocol.py")


def pytest_collection_modifyitems(items):
    """The longest tests (the 8-device subprocess, the tiny comparison) first, so that two xdist workers do not
    end the run with one of them alone on a long test; the rest keep their order. A test of INTEGRATION_ONLY's folders
    not marked integration stops the run."""
    rank = lambda item: next((i for i, path in enumerate(RUN_FIRST) if item.nodeid.startswith(path)), len(RUN_FIRST))
    items.sort(key=rank)
    for item in items:
        in_folder = any(item.path.is_relative_to(folder) for folder in INTEGRATION_ONLY)
        if in_folder and not item.get_closest_marker("integration"):
            raise pytest.UsageError(f"{item.nodeid}: its folder holds integration tests only: mark it integration")
