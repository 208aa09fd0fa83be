"""The comparison pipeline (experiments/compare, experiments/report.py): the memory-matched window, the reuse of
finished runs, the train-step timer on the trainer's own step, and the report's tables, ratios and plots."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
sys.path[:0] = [str(EXPERIMENTS / "compare"), str(EXPERIMENTS)]

from models import compose_config, lm_cache_bytes, matched_window, model_overrides  # noqa: E402
from presets import CPU, GPU, PRESETS, SMOKE, Preset  # noqa: E402
from quality import measure_quality, run_dir  # noqa: E402
from report import write_report  # noqa: E402
from speed import train_step_time  # noqa: E402

from retention.train.metrics import MetricsWriter  # noqa: E402


@pytest.mark.parametrize("preset", [SMOKE, CPU, GPU], ids=lambda p: p.name)
def test_matched_window_holds_the_power_state_bytes(preset):
    """swa_matched's cache at a long context has the power model's bytes, less than one token's KV bytes."""
    window = matched_window(preset)
    power = compose_config(model_overrides("power", preset, window))
    swa = compose_config(model_overrides("swa_matched", preset, window))
    softmax = compose_config(model_overrides("softmax", preset, window))
    assert swa.model.window == window and swa.model.pattern == "W"
    per_token = lm_cache_bytes(softmax, 2) - lm_cache_bytes(softmax, 1)
    state, ring = lm_cache_bytes(power, 65536), lm_cache_bytes(swa, 65536)
    assert lm_cache_bytes(power, 7) == state  # the state does not grow
    assert 0 <= state - ring < per_token, (state, ring, per_token)


def test_every_preset_builds_valid_configs():
    """Each preset's model and task overrides give configs the trainer accepts (its value checks run)."""
    from retention.train.config import build

    for preset in PRESETS.values():
        for task in preset.tasks.values():
            cfg = compose_config([*model_overrides("hybrid", preset, 64), *task.model_overrides("hybrid"),
                                  f"data={task.data}", *task.overrides])  # fmt: skip
            lm, _ = build(cfg)
            assert set(lm.layer_kinds) == {"P", "A"}, lm.layer_kinds  # a hybrid at every task's depth
        assert all(preset.tokens_per_step % T == 0 for T in preset.speed_lengths)


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="model must be one of"):
        model_overrides("mamba", SMOKE, 8)


def test_finished_runs_are_reused_not_retrained(tmp_path):
    """A run folder with a summary.json is read back: no training happens (the summaries are not runnable)."""
    preset = Preset(**{**SMOKE.__dict__, "tasks": {"mqar": SMOKE.tasks["mqar"]}, "models": ("power", "softmax"),
                       "seeds": (0, 3)})  # fmt: skip
    for model in preset.models:
        for seed in preset.seeds:
            folder = run_dir(tmp_path, "mqar", model, seed)
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps({"model": model, "seed": seed}))
    results = measure_quality(preset, 8, tmp_path)
    assert results == {"mqar": {m: {str(s): {"model": m, "seed": s} for s in (0, 3)} for m in ("power", "softmax")}}


def test_train_step_time_runs_the_trainer_step():
    """The timer compiles the trainer's step once and reports consistent throughput and XLA memory figures."""
    cfg = compose_config(model_overrides("power", SMOKE, 8))
    r = train_step_time(cfg, T=48, B=3, repeats=2, peak_flops=1e11)
    assert (r["T"], r["batch"]) == (48, 3) and len(r["times_s"]) == 2
    assert r["step_s"] == pytest.approx(float(np.median(r["times_s"])))
    assert r["tokens_per_s"] == pytest.approx(3 * 48 / r["step_s"])
    assert r["temp_bytes"] > 0 and r["argument_bytes"] > 0


def _fake_comparison(tmp_path: Path) -> Path:
    """speed.json, quality.json and TensorBoard logs of a made-up two-model comparison with known numbers."""
    rng = np.random.default_rng(0)
    data, runs = tmp_path / "data", tmp_path / "runs"
    data.mkdir()
    machine = {"device": "cpu", "backend": "cpu", "devices": 1, "cpus": 2, "jax": "0", "date": "today"}
    meta = {"preset": "fake", "matched_window": 72, "command": "made up", "machine": machine}
    step = {"softmax": {1024: 0.5, 4096: 3.0}, "power": {1024: 0.75, 4096: 1.2}}
    speed = {m: {"pattern": m[0].upper(),
                 "train": [{"T": T, "batch": 4096 // T, "step_s": s, "tokens_per_s": 4096 / s, "peak_fraction": 0.1,
                            "temp_bytes": 3 * 2**20} for T, s in step[m].items()],
                 "decode": {"1024": {"ms_per_token": 2.0 if m == "softmax" else 0.5}},
                 "cache_bytes": {"1024": 2**20 if m == "softmax" else 2**15}} for m in step}  # fmt: skip
    (data / "speed.json").write_text(json.dumps({**meta, "results": speed}))
    quality = {"mqar": {}}
    for m in step:
        quality["mqar"][m] = {}
        for seed in (0, 1):
            acc = {"64": 0.9 - 0.2 * seed, "256": 0.5}
            evals = {L: {"accuracy": a, "loss": 1.0} for L, a in acc.items()}
            quality["mqar"][m][str(seed)] = {"params": 1000, "wall_s": 10.0, "tokens_per_step": 640, "eval": evals}
            writer = MetricsWriter(str(run_dir(runs, "mqar", m, seed) / "tb"))
            for i in range(1, 6):
                writer.scalars(10 * i, {"loss": float(5 - i + rng.uniform())}, "train")
            writer.close()
    (data / "quality.json").write_text(json.dumps({**meta, "runs": str(runs), "results": quality}))
    return data


def test_report_tables_ratios_and_plots(tmp_path):
    data = _fake_comparison(tmp_path)
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


def test_report_without_results_says_what_to_run(tmp_path):
    with pytest.raises(SystemExit, match="run experiments/compare/run.py"):
        write_report(tmp_path, tmp_path / "R.md")
