"""The time estimate of a preset (experiments/compare/estimate.py) on made-up measured runs with known seconds: the
fitted overhead and rate, the job counts, and the stage seconds of <runs>/timings.json."""

import json

import pytest
from omegaconf import OmegaConf

from experiments.compare.estimate import (
    earliest_steps,
    estimate,
    eval_job_count,
    extension_job_count,
    fit,
    main,
    trained_jobs,
)
from experiments.compare.models import compose_config
from experiments.compare.presets import CPU, SMOKE
from experiments.compare.runs import timed

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration


def test_fit_recovers_overhead_and_rate():
    points = [(1000, 5.0 + 1000 / 250), (5000, 5.0 + 5000 / 250), (3000, 5.0 + 3000 / 250)]
    overhead, per_token = fit(points)
    assert overhead == pytest.approx(5.0) and 1 / per_token == pytest.approx(250.0)
    assert fit([(100, 3.0), (100, 5.0)]) == (0.0, pytest.approx(0.04))  # one token count: no overhead


def test_smoke_job_counts():
    """smoke's mqar: 5 trained entries (Mamba2 on the frontier) x 2 lrs, and 3 headline entries' second seed;
    tests: 3 headline x 2 seeds, the ablation and Mamba2 once, the quantized-cache and quantized-state entries at
    their bases' 2 seeds. Its mqar_t32 (the frontier's second length): softmax and power x 2 lrs, one seed; tests:
    those two, the 4-bit cache and the fp8 state. One extension at most for each of the 7 trained entries."""
    assert len(trained_jobs(SMOKE)) == 5 * 2 + 3 + 2 * 2 and eval_job_count(SMOKE) == 3 * 2 + 1 + 1 + 2 + 2 + 4
    assert extension_job_count(SMOKE) == 7


def test_earliest_stop_of_the_rule():
    """cpu's mqar: evals every 50 steps, patience 4, min_step 600: no stop before 600 (patience alone: 250); with
    the rule off, the cap; never past the cap."""
    spec = CPU.tasks["mqar"]
    cfg = compose_config([f"experiment={spec.experiment}", *spec.overrides])
    assert earliest_steps(cfg) == 600
    cfg.trainer.early_stop.min_step = 0
    assert earliest_steps(cfg) == 250
    cfg.trainer.early_stop.patience = 0
    assert earliest_steps(cfg) == cfg.trainer.steps == 1000
    cfg.trainer.early_stop.patience, cfg.trainer.steps = 40, 300
    assert earliest_steps(cfg) == 300


def made_up_run(folder, steps: int, batch: int, seq_len: int, cpu_s: float) -> None:
    folder.mkdir(parents=True)
    (folder / "compare.json").write_text(json.dumps({"task": "mqar", "cpu_s": cpu_s, "wall_s": 2 * cpu_s}))
    cfg = {"trainer": {"steps": steps}, "data": {"batch_size": batch, "seq_len": seq_len}}
    OmegaConf.save(OmegaConf.create(cfg), folder / "config.yaml")


def test_estimate_from_measured_runs_and_stage_timings(tmp_path, monkeypatch):
    made_up_run(tmp_path / "a", 10, 4, 64, 2.0 + 2560 / 1280)  # 2 s overhead, 1,280 tokens a second
    made_up_run(tmp_path / "b", 30, 4, 64, 2.0 + 7680 / 1280)
    clock = iter([0.0, 10.0, 100.0, 130.0])  # perf_counter, process_time at start; then at the end
    monkeypatch.setattr("experiments.compare.runs.time.perf_counter", lambda: next(clock))
    monkeypatch.setattr("experiments.compare.runs.time.process_time", lambda: next(clock))
    with timed(tmp_path, "test", 4):  # 4 test jobs: 100 wall and 120 CPU seconds
        pass
    assert json.loads((tmp_path / "timings.json").read_text())["test"] == {"jobs": 4, "wall_s": 100.0, "cpu_s": 120.0}
    out = estimate(SMOKE, [tmp_path], "cpu_s")
    mqar, t32 = 2.0 + 3 * 4 * 64 / 1280, 2.0 + 3 * 4 * 32 / 1280  # 3 steps of 4 x 64 (4 x 32) tokens
    assert out["overhead_s"] == pytest.approx(2.0) and out["tokens_per_s"] == pytest.approx(1280.0)
    assert out["train_s"] == pytest.approx(13 * mqar + 4 * t32) == out["train_s_earliest"]  # 3 steps: no stop
    assert out["extend_s_max"] == pytest.approx(5 * mqar + 2 * t32)
    assert out["test_s"] == pytest.approx(16 * 30.0) and out["speed_s"] is None
    assert out["total_s"] == pytest.approx(out["train_s"] + out["extend_s_max"] + out["test_s"])
    assert out["total_s_earliest"] == pytest.approx(out["train_s"] + out["test_s"])
    made_up_run(tmp_path / "c", 3, 4, 64, 7.0)  # a run at smoke's own tokens: its seconds, not the line's
    assert estimate(SMOKE, [tmp_path], "cpu_s")["seconds_per_run"]["mqar"] == pytest.approx(7.0)


def test_estimate_from_the_committed_quality_json(tmp_path):
    """No run folder (a fresh clone): the runs recorded in quality.json, each with its overrides and seconds, give
    the fit; runs without seconds are left out; with neither, a ValueError names where it looked."""
    task = SMOKE.tasks["mqar"]
    overrides = [f"experiment={task.experiment}", *task.overrides]
    runs = [
        {"record": {"task": "mqar", "overrides": [*overrides, "trainer.steps=10"], "cpu_s": 2.0 + 10 * 256 / 1280}},
        {"record": {"task": "mqar", "overrides": [*overrides, "trainer.steps=30"], "cpu_s": 2.0 + 30 * 256 / 1280}},
        {"record": None},
    ]
    quality = tmp_path / "quality.json"
    quality.write_text(json.dumps({"runs": runs}))
    out = estimate(SMOKE, [tmp_path / "no_runs"], "cpu_s", committed=quality)
    assert out["overhead_s"] == pytest.approx(2.0) and out["tokens_per_s"] == pytest.approx(1280.0)
    with pytest.raises(ValueError, match=r"no finished training run with cpu_s under .*no_runs, .*missing.json"):
        estimate(SMOKE, [tmp_path / "no_runs"], "cpu_s", committed=tmp_path / "missing.json")


def test_estimate_command_from_a_fresh_clone(tmp_path, monkeypatch, capsys):
    """`python -m experiments.compare.estimate --preset smoke` with no outputs/: the committed quality.json; with
    none either, it exits with a message (never a traceback)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="no finished training run"):
        main(["--preset", "smoke"])
    task = SMOKE.tasks["mqar"]
    run = {"record": {"task": "mqar", "overrides": [f"experiment={task.experiment}", *task.overrides], "cpu_s": 4.0}}
    (tmp_path / "results" / "compare" / "smoke").mkdir(parents=True)
    (tmp_path / "results" / "compare" / "smoke" / "quality.json").write_text(json.dumps({"runs": [run]}))
    main(["--preset", "smoke"])
    assert "total:" in capsys.readouterr().out
