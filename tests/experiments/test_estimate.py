"""The time estimate of a preset (experiments/compare/estimate.py) on made-up measured runs with known seconds: the
fitted overhead and rate, the job counts, each job at its entry's seconds, the stage and call seconds of
timings.json, and the jobs a --part/--only call runs (run_stages's own selection)."""

import json

import pytest
from omegaconf import OmegaConf

from experiments.compare.estimate import (
    earliest_steps,
    estimate,
    eval_runs,
    extension_slots,
    fit,
    main,
    other_seed_runs,
    selected_jobs,
)
from experiments.compare.models import compose_config
from experiments.compare.presets import CPU, SMOKE
from experiments.compare.protocol import sweep_runs
from experiments.compare.quality import STAGES, run_stages
from experiments.compare.runs import timed
from experiments.compare.speed import speed_recipe

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
    jobs = selected_jobs(SMOKE)
    assert len(jobs["sweep"]) + len(jobs["seeds"]) == 5 * 2 + 3 + 2 * 2
    assert len(jobs["test"]) == 3 * 2 + 1 + 1 + 2 + 2 + 4
    assert len(extension_slots(SMOKE)) == 7


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


def made_up_run(folder, steps: int, batch: int, seq_len: int, cpu_s: float, entry="softmax", lr=1e-3, task="mqar"):
    folder.mkdir(parents=True)
    record = {"task": task, "entry": entry, "lr": lr, "cpu_s": cpu_s, "wall_s": 2 * cpu_s}
    (folder / "compare.json").write_text(json.dumps(record))
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
    assert out["extend_s"] == 0.0 and out["extend_s_max"] == pytest.approx(5 * mqar + 2 * t32)
    assert out["test_s"] == pytest.approx(16 * 30.0) and out["speed_s"] is None and out["call_s"] is None
    assert out["total_s"] == pytest.approx(out["train_s"] + out["test_s"]) == out["total_s_low"]
    assert out["total_s_high"] == pytest.approx(out["train_s"] + out["extend_s_max"] + out["test_s"])
    made_up_run(tmp_path / "c", 3, 4, 64, 7.0)  # a run at smoke's own tokens: its seconds, not the line's
    assert estimate(SMOKE, [tmp_path], "cpu_s", only={"task": {"mqar"}})["train_s"] == pytest.approx(13 * 7.0)
    with pytest.raises(ValueError, match="key must be one of"):
        estimate(SMOKE, [tmp_path], "seconds")


def test_each_job_at_its_entrys_measured_seconds(tmp_path):
    """A run of an entry at the task's tokens gives that entry's jobs their seconds and the task's other entries
    the task's mean; each (task, entry)'s test seconds its test evals'; an lr outside the grid, measured here or
    committed, is an extension the sweep asked for, counted in the expected total at the seconds measured here (wall
    seconds: twice the CPU's here)."""
    made_up_run(tmp_path / "p", 3, 4, 64, 10.0, entry="power")
    made_up_run(tmp_path / "s", 3, 4, 64, 4.0, entry="softmax")
    made_up_run(tmp_path / "x", 3, 4, 64, 4.0, entry="softmax", lr=0.1)  # the grid is 1e-3, 1e-2: an extension
    for name, test_s in (("p", 5.0), ("s", 1.0)):
        record = json.loads((tmp_path / name / "compare.json").read_text())
        (tmp_path / name / "compare.json").write_text(json.dumps({**record, "test_wall_s": test_s}))
    only = {"task": {"mqar"}}
    out = estimate(SMOKE, [tmp_path], "wall_s", only=only)
    jobs = selected_jobs(SMOKE, only=only)
    per_entry = {"power": 20.0, "softmax": 8.0}
    task_mean = (20.0 + 8.0 + 8.0) / 3
    expected = sum(per_entry.get(r.entry, task_mean) for r in [*jobs["sweep"], *jobs["seeds"]])
    assert out["train_s"] == pytest.approx(expected)
    assert out["extension_runs"] == 1 and out["extend_s"] == pytest.approx(8.0)
    tests = {"power": 5.0, "softmax": 1.0}
    assert out["test_s"] == pytest.approx(sum(tests.get(r.entry, 3.0) for r in jobs["test"]))
    assert out["speed_s"] == 0.0 and out["speed_models"] == []  # a filtered call runs no speed sweep
    assert out["total_s"] == pytest.approx(out["train_s"] + 8.0 + out["test_s"])
    task = SMOKE.tasks["mqar"]
    overrides = [f"experiment={task.experiment}", *task.overrides]
    power = {"task": "mqar", "entry": "power", "lr": 0.2, "overrides": overrides, "wall_s": 99.0}
    quality = tmp_path / "quality.json"
    evaluated = {**power, "entry": "softmax_kv4", "lr": 0.3, "test_wall_s": 5.0}  # an eval alone: no extension
    del evaluated["wall_s"]
    runs = [{"record": power}, {"record": evaluated}]
    quality.write_text(json.dumps({"runs": runs}))  # a committed extension: counted, not its seconds
    out = estimate(SMOKE, [tmp_path], "wall_s", committed=quality, only=only)
    assert out["extension_runs"] == 2 and out["extend_s"] == pytest.approx(8.0 + 20.0)


def test_an_entry_not_measured_on_a_task_keeps_its_ratio_to_the_reference(tmp_path):
    """power took 2.5x softmax's seconds on mqar; on mqar_t32, where only softmax ran, power's runs are estimated
    at 2.5x softmax's there (softmax: the headline's first entry), not at the task's mean."""
    made_up_run(tmp_path / "s", 3, 4, 64, 4.0, entry="softmax")
    made_up_run(tmp_path / "p", 3, 4, 64, 10.0, entry="power")
    made_up_run(tmp_path / "t", 3, 4, 32, 3.0, entry="softmax", task="mqar_t32")
    only = {"task": {"mqar_t32"}, "entry": {"power"}}
    out = estimate(SMOKE, [tmp_path], "cpu_s", only=only)
    assert out["trained_runs"] == 2 and out["train_s"] == pytest.approx(2 * 3.0 * 2.5)


def test_the_selection_is_run_py_s(tmp_path, monkeypatch):
    """Every --part/--only the estimate takes selects the jobs run_stages runs for it (its stages' job lists
    given, each action recording its job), and the parts of n cover every job once."""
    lists = {"sweep": sweep_runs(CPU), "seeds": other_seed_runs(CPU), "test": eval_runs(CPU), "extend": []}
    monkeypatch.setattr("experiments.compare.quality.stage_jobs", lambda preset, runs, stage: lists[stage])
    for part, only in [((1, 1), {}), ((2, 3), {}), ((1, 2), {"task": {"mqar_t128"}}), ((1, 1), {"entry": {"power"}})]:
        ran = {stage: [] for stage in STAGES}
        actions = {s: (lambda preset, run, runs, s=s, ran=ran: ran[s].append(run)) for s in STAGES}
        monkeypatch.setattr("experiments.compare.quality.STAGES", actions)
        run_stages(CPU, tmp_path, part, only)
        mine = selected_jobs(CPU, part, only)
        assert {s: ran[s] for s in mine} == mine, (part, only)
    parts = [selected_jobs(CPU, (k, 3)) for k in (1, 2, 3)]
    for stage, jobs in lists.items():
        if jobs:
            assert sorted(sum((p[stage] for p in parts), []), key=repr) == sorted(jobs, key=repr), stage


def test_speed_and_call_seconds_from_the_committed_timings(tmp_path):
    """The speed sweep counts only the models speed.json lacks at the preset's recipe, at the measured seconds a
    model; a call's own seconds are its "report" stage's (collecting, the report), a call."""
    made_up_run(tmp_path / "runs" / "a", 3, 4, 64, 4.0)
    data = tmp_path / "data"
    data.mkdir()
    timings = {
        "speed": {"jobs": 2, "wall_s": 300.0, "cpu_s": 500.0},
        "sweep": {"jobs": 10, "wall_s": 500.0, "cpu_s": 800.0},
        "report": {"jobs": 2, "wall_s": 100.0, "cpu_s": 150.0},
    }
    (data / "timings.json").write_text(json.dumps(timings))
    softmax = {"recipe": speed_recipe("softmax", SMOKE)}
    (data / "speed.json").write_text(json.dumps({"results": {"softmax": softmax, "power": {"recipe": "old"}}}))
    out = estimate(SMOKE, [tmp_path / "runs"], "wall_s", data=data)
    assert out["speed_models"] == ["power"] and out["speed_s"] == pytest.approx(150.0)
    assert out["call_s"] == pytest.approx(100.0 / 2)
    assert estimate(SMOKE, [tmp_path / "runs"], "wall_s", part=(2, 2), data=data)["speed_s"] == 0.0


def test_estimate_from_the_committed_quality_json(tmp_path):
    """No run folder (a fresh clone): the runs recorded in quality.json, each with its overrides and seconds, give
    the fit; runs without seconds are left out; with neither, a ValueError names where it looked."""
    task = SMOKE.tasks["mqar"]
    overrides = [f"experiment={task.experiment}", *task.overrides]
    fields = {"task": "mqar", "entry": "softmax", "lr": 1e-3}
    runs = [
        {"record": {**fields, "overrides": [*overrides, "trainer.steps=10"], "cpu_s": 2.0 + 10 * 256 / 1280}},
        {"record": {**fields, "overrides": [*overrides, "trainer.steps=30"], "cpu_s": 2.0 + 30 * 256 / 1280}},
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
    none either, it exits with a message (never a traceback); a bad --part is named."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="no finished training run"):
        main(["--preset", "smoke"])
    task = SMOKE.tasks["mqar"]
    overrides = [f"experiment={task.experiment}", *task.overrides]
    run = {"record": {"task": "mqar", "entry": "softmax", "lr": 1e-3, "overrides": overrides, "wall_s": 4.0}}
    (tmp_path / "results" / "compare" / "smoke").mkdir(parents=True)
    (tmp_path / "results" / "compare" / "smoke" / "quality.json").write_text(json.dumps({"runs": [run]}))
    main(["--preset", "smoke", "--only", "task=mqar"])
    assert "minutes expected (wall seconds" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--part must be k/n"):
        main(["--preset", "smoke", "--part", "3/2"])
