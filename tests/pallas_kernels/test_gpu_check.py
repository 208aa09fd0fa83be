"""`python -m experiments.gpu_check --quick` runs on CPU (interpret mode, tiny sizes) through every part and writes its
JSON, the kernels matching the XLA path; the tuned block sizes it would write on a device round-trip through
`default_block_sizes` (and only on that device kind and backend); the candidate grids are valid."""

import dataclasses
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

import pallas_kernels.power_retention as kernels
from pallas_kernels.power_retention import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # the whole script in a subprocess: its parts are each tested on their own in the quick tier
def test_quick_run_covers_every_part(tmp_path):
    out, tuned = tmp_path / "check.json", tmp_path / "tuned.json"
    command = [sys.executable, "-m", "experiments.gpu_check", "--quick", "--out", str(out), "--tuned", str(tuned)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
    report = json.loads(out.read_text())
    assert report["correctness"]["ok"] and max(report["correctness"]["errors"].values()) < 1e-4
    assert len(report["sweep"]) == 1 and report["best"] == report["sweep"][0]["blocks"]
    assert set(report["decode_seconds_per_token"]) == {"pallas", "xla", "softmax kv-cache"}
    assert set(report["lm_step_seconds"]) == {"P", "A"}
    assert all(s > 0 for s in [*report["decode_seconds_per_token"].values(), *report["lm_step_seconds"].values()])
    assert not tuned.exists()  # a CPU run tunes nothing
    assert "LM 2 layers" in result.stdout and "softmax kv-cache" in result.stdout


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
def test_tuned_block_sizes_round_trip(tmp_path, monkeypatch, backend):
    path = str(tmp_path / "tuned.json")
    chosen = kernels.candidate_block_sizes(backend, 64)[-1]
    kernels.write_tuned("NVIDIA H200", 64, chosen, path=path)
    kernels.write_tuned("NVIDIA H200", 128, kernels.candidate_block_sizes(backend, 128)[1], path=path)
    h200 = SimpleNamespace(device_kind="NVIDIA H200", platform="cuda")
    monkeypatch.setattr(config.jax, "devices", lambda: [h200])
    committed = config._committed_block_sizes(backend, 64)
    if backend == "gpu":  # the tuned entry on its own device and backend, the committed one elsewhere
        assert kernels.default_block_sizes("gpu", 64, path=path) == chosen
    assert kernels.default_block_sizes("tpu", 64, path=path) == config._committed_block_sizes("tpu", 64)
    assert kernels.default_block_sizes(backend, 32, path=path) == config._committed_block_sizes(backend, 32)
    assert kernels.default_block_sizes(backend, 64, path=str(tmp_path / "absent.json")) == committed


@pytest.mark.parametrize("backend,d", [("gpu", 64), ("gpu", 128), ("tpu", 64), ("tpu", 128)])
def test_candidate_grid_is_valid(backend, d):
    grid = kernels.candidate_block_sizes(backend, d)
    assert grid[0] == config._committed_block_sizes(backend, d) and len(set(grid)) == len(grid) > 1
    for blocks in grid:
        state_rows, read_rows = blocks.rows(d)
        assert d % state_rows == 0 and d % read_rows == 0
        kernels.check_supported(2, d, 1, backend, blocks.chunk)
    assert len({dataclasses.replace(b, num_warps=8) for b in grid}) > 1


def test_mosaic_forward_joins_the_gpu_sweep_only():
    from experiments import gpu_check

    blocks = gpu_check.mosaic_candidates("gpu", gpu_check.FULL)
    assert [(b.forward, b.chunk) for b in blocks] == [("mosaic", 64), ("mosaic", 128)]
    assert gpu_check.mosaic_candidates("tpu", gpu_check.FULL) == []
    assert gpu_check.mosaic_candidates("gpu", gpu_check.QUICK) == []  # d = 16: no Mosaic forward
