"""Shared by the multi-device tests: JAX fixes its device count at start-up, so each `multidevice_*.py` file runs
in its own pytest subprocess with 8 host (CPU) devices."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_DEVICES = 8


def run_pytest_on_devices(
    paths: list[str], n_devices: int = N_DEVICES, timeout: float = 1800, markexpr: str = ""
) -> subprocess.CompletedProcess:
    """`python -m pytest -q -rA [-m markexpr] paths` (-rA: a PASSED line per test) in one process with
    `n_devices` fake CPU devices; stdout and stderr merged. The caller passes its own run's `-m`
    (`make test-integration`: "integration and not slow"), so the subprocess runs the same tier."""
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n_devices}".strip(),
        "JAX_PLATFORMS": "cpu",
        "PYTHONUNBUFFERED": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-m", markexpr, *paths],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def require_devices(n_devices: int = N_DEVICES) -> None:
    """Fail (not skip) a multidevice file run without its devices: it is meant for `run_pytest_on_devices`."""
    import jax

    assert jax.device_count() == n_devices, (
        f"this file needs {n_devices} devices (XLA_FLAGS=--xla_force_host_platform_device_count={n_devices}); "
        f"it runs through tests/parallel/test_eight_devices.py, got {jax.device_count()}"
    )
