"""Runs the multidevice_*.py files of this folder in one subprocess with 8 host devices (the device count is fixed
when JAX starts, and the rest of the suite runs on one; one process, so JAX and the project load once): the
context-parallel ops against the single-device ops, the sharded train step against the single-device step,
checkpoints across meshes, and the mesh errors."""

import os

import pytest

from tests.parallel.common import run_pytest_on_devices

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = sorted(f for f in os.listdir(HERE) if f.startswith("multidevice_") and f.endswith(".py"))


def test_there_are_multidevice_files():
    assert set(FILES) >= {"multidevice_context_parallel.py", "multidevice_step.py", "multidevice_checkpoint.py"}


@pytest.mark.integration
def test_on_eight_devices(request):
    """Every file's tests of this run's tier (its -m: `make test-integration` leaves out the further cases marked
    slow), each file among the passed ones."""
    paths = [os.path.join("tests", "parallel", name) for name in FILES]
    result = run_pytest_on_devices(paths, markexpr=request.config.option.markexpr)
    assert result.returncode == 0, result.stdout[-8000:]
    assert " passed" in result.stdout and " skipped" not in result.stdout, result.stdout[-3000:]
    passed = {line.split()[1].split("::")[0] for line in result.stdout.splitlines() if line.startswith("PASSED ")}
    assert passed == set(paths), (sorted(passed), result.stdout[-3000:])


def test_comm_volume_formulas_match_the_lowered_program(tmp_path):
    """python -m experiments.comm_volume: its byte formulas equal the collectives in the shard_map'd ops' program."""
    import json
    import subprocess
    import sys

    from tests.parallel.common import ROOT

    out = tmp_path / "comm.json"
    args = "--hlo --n 4 --H 2 --d 8 --B 2 --contexts 256 1024".split()
    command = [sys.executable, "-m", "experiments.comm_volume", *args, "--out", str(out)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stdout[-3000:]
    table = json.loads(out.read_text())
    first = table["rows"][0]
    assert table["hlo_forward"]["retention_per_device"] == first["retention_fwd_per_device"] > 0
    assert table["hlo_forward"]["gathered_kv_per_device"] == first["gathered_kv_fwd_per_device"] > 0
    assert table["rows"][1]["gathered_kv_fwd_per_device"] == 4 * first["gathered_kv_fwd_per_device"]
    assert table["rows"][1]["retention_fwd_per_device"] == first["retention_fwd_per_device"]  # independent of T
    assert table["hlo_forward"]["matrix_state"] == table["matrix_state_fwd_per_device"]  # the three matrix-state ops
