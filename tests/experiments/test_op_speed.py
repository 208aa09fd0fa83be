"""experiments/op_speed.py end to end at tiny sizes: the rows it writes for each dtype (their names, kinds and the
cache bytes by dtype), and --keep-going recording a variant that raises as a 'failed' row while the others are
timed (the first GPU run's kernels failed to compile; the run must still time the rest)."""

import json

import pytest

from experiments import op_speed

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration

TINY = ["--lengths", "32", "--contexts", "32", "--chunks", "16", "--repeats", "1", "--heads", "1", "--head-dim", "8"]
TINY += ["--decode-tokens", "2", "--matrix-state-ops", "gla"]


@pytest.mark.parametrize("dtype, itemsize", [("float32", 4), ("bfloat16", 2)])
def test_rows_for_each_dtype(tmp_path, dtype, itemsize):
    out = tmp_path / "ops.json"
    op_speed.main([*TINY, "--dtype", dtype, "--out", str(out)])
    result = json.loads(out.read_text())
    train = {r["name"] for r in result["rows"] if r["kind"] == "train"}
    assert {"power c=16", "softmax blockwise", "gla c=64"} <= train  # CPU: the XLA paths, named as before
    assert all(r["fwd_s"] > 0 and r["fwd_bwd_s"] > 0 for r in result["rows"] if r["kind"] == "train")
    (decode,) = [r for r in result["rows"] if r["kind"] == "decode"]
    assert decode["kv_bytes"] == 2 * 32 * 8 * itemsize  # K and V: context x heads x head dim, in the dtype
    assert result["config"]["dtype"] == dtype


def test_keep_going_records_a_failing_variant(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("Failed to compile Triton kernel")

    monkeypatch.setattr(op_speed, "power_retention", broken)
    out = tmp_path / "ops.json"
    with pytest.raises(RuntimeError, match="Triton"):  # without the flag the error stops the run
        op_speed.main([*TINY, "--skip-decode", "--out", str(out)])
    op_speed.main([*TINY, "--skip-decode", "--keep-going", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    (failed,) = [r for r in rows if r["kind"] == "failed"]
    assert failed["name"] == "power c=16" and "Triton" in failed["error"]
    assert {r["name"] for r in rows if r["kind"] == "train"} >= {"softmax blockwise", "gla c=64"}
