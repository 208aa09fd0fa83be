"""The comparison report (experiments/report.py) on a made-up comparison with known numbers: its tables, ratios,
the models' layers and the plots."""

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.compare.quality import run_dir
from experiments.report import write_report
from retention.train.metrics import MetricsWriter

STEP_S = {"softmax": {1024: 0.5, 4096: 3.0}, "power": {1024: 0.75, 4096: 1.2}}
SPEED_KINDS = {"softmax": "A", "power": "P"}
QUALITY_KINDS = {"softmax": "A", "power": "PP"}  # the power model has two layers in the task


def train_row(T: int, step_s: float) -> dict:
    return {"T": T, "batch": 4096 // T, "step_s": step_s, "tokens_per_s": 4096 / step_s, "peak_fraction": 0.1}


def fake_comparison(tmp_path: Path) -> Path:
    """speed.json, quality.json and TensorBoard logs of a made-up two-model comparison with known numbers."""
    rng = np.random.default_rng(0)
    data, runs = tmp_path / "data", tmp_path / "runs"
    data.mkdir()
    machine = {"device": "cpu", "backend": "cpu", "devices": 1, "cpus": 2, "jax": "0", "date": "today"}
    meta = {"preset": "fake", "matched_window": 72, "command": "made up", "machine": machine}
    speed = {
        m: {
            "layer_kinds": SPEED_KINDS[m],
            "train": [{**train_row(T, s), "temp_bytes": 3 * 2**20} for T, s in STEP_S[m].items()],
            "decode": {"1024": {"ms_per_token": 2.0 if m == "softmax" else 0.5}},
            "cache_bytes": {"1024": 2**20 if m == "softmax" else 2**15},
        }
        for m in STEP_S
    }
    (data / "speed.json").write_text(json.dumps({**meta, "results": speed}))
    quality = {"mqar": {}}
    for m in STEP_S:
        quality["mqar"][m] = {}
        for seed in (0, 1):
            acc = {"64": 0.9 - 0.2 * seed, "256": 0.5}
            evals = {L: {"accuracy": a, "loss": 1.0} for L, a in acc.items()}
            summary = {"layer_kinds": QUALITY_KINDS[m], "params": 1000, "wall_s": 10.0, "tokens_per_step": 640}
            quality["mqar"][m][str(seed)] = {**summary, "eval": evals}
            writer = MetricsWriter(str(run_dir(runs, "mqar", m, seed) / "tb"))
            for i in range(1, 6):
                writer.scalars(10 * i, {"loss": float(5 - i + rng.uniform())}, "train")
            writer.close()
    (data / "quality.json").write_text(json.dumps({**meta, "runs": str(runs), "results": quality}))
    return data


def test_report_tables_ratios_and_plots(tmp_path):
    data = fake_comparison(tmp_path)
    out = tmp_path / "REPORT.md"
    write_report(data, out, op_speed=None)
    text = out.read_text()
    assert "| power (P) | 0.75 s (0.67x) | 1.2 s (2.5x) |" in text  # softmax's time over power's
    assert "| power (P) | 0.5 ms (4x) |" in text
    assert "| softmax (A) | 1,000 | 0.800 (0.700-0.900) | 0.500 (0.500-0.500) | 10 s |" in text  # mean (range)
    assert "| power (P) | 2.5x | 4x | 32 KiB | 0.800 / 0.500 |" in text  # the headline row
    assert "matched to the power state's bytes is 72 tokens" in text
    for png in ("speed.png", "quality.png", "curves.png"):
        assert (data / png).stat().st_size > 10_000
        assert f"(data/{png})" in text  # linked relative to the report


def test_report_names_each_run_by_its_layers(tmp_path):
    """A task's model is labelled with the layers it trained with, and the headline says where they differ."""
    data = fake_comparison(tmp_path)
    write_report(data, tmp_path / "REPORT.md", op_speed=None)
    text = (tmp_path / "REPORT.md").read_text()
    assert "| power (PP) | 1,000 | 0.800 (0.700-0.900) |" in text
    assert "Some tasks train other layers (mqar: softmax A, power PP)." in text


def test_report_without_results_says_what_to_run(tmp_path):
    with pytest.raises(SystemExit, match="run python -m experiments.compare.run"):
        write_report(tmp_path, tmp_path / "R.md")
