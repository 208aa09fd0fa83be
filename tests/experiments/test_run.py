"""The comparison's command (experiments/compare/run.py): --report-only with no finished run refuses, leaving the
committed report and data as they are; a resumed speed stage with nothing left to measure writes nothing; the
report, from either command, leaves out speed measured with another recipe than the preset's."""

import json
import shutil
from pathlib import Path

import pytest

from experiments.compare.presets import PRESETS
from experiments.compare.report import write_report
from experiments.compare.run import main
from experiments.compare.speed import speed_recipe

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration


def test_report_only_without_runs_keeps_the_committed_results(tmp_path, monkeypatch):
    """A fresh clone (results committed, no outputs/): `--preset cpu --report-only` exits non-zero naming the runs
    folder, and the report and quality.json are byte for byte what they were."""
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "results" / "compare" / "cpu"
    data.mkdir(parents=True)
    committed = {tmp_path / "results" / "REPORT.md": "# committed report\n", data / "quality.json": '{"runs": [1]}'}
    for path, text in committed.items():
        path.write_text(text)
    with pytest.raises(SystemExit) as stop:
        main(["--preset", "cpu", "--report-only"])
    assert stop.value.code not in (0, None) and "no finished run under outputs/compare/cpu" in str(stop.value.code)
    assert {path: path.read_text() for path in committed} == committed
    assert sorted(p.name for p in data.iterdir()) == ["quality.json"]


def test_a_speed_stage_with_every_model_done_leaves_speed_json_untouched(tmp_path, monkeypatch):
    """Resuming `--preset cpu` with every speed model measured measures nothing and keeps speed.json byte for byte
    (it used to rewrite it with a new date, as if measured again)."""
    data = tmp_path / "data"
    data.mkdir()
    committed = Path("results/compare/cpu").absolute()
    monkeypatch.chdir(tmp_path)  # no outputs/: the report reads no run's curves
    shutil.copy(committed / "quality.json", data / "quality.json")
    measured = json.loads((committed / "speed.json").read_text())
    for name, result in measured["results"].items():  # as measured with today's preset
        result["recipe"] = speed_recipe(name, PRESETS["cpu"])
    (data / "speed.json").write_text(json.dumps(measured))
    before = (data / "speed.json").read_bytes()
    main(["--preset", "cpu", "--skip-quality", "--data", str(data), "--runs", str(tmp_path / "runs")])
    assert (data / "speed.json").read_bytes() == before
    assert (data / "REPORT.md").exists()


def test_a_speed_result_of_another_recipe_is_measured_again(monkeypatch):
    """A speed.json model measured under other overrides (a changed preset) is measured again; one measured with
    the preset's recipe is kept as it is."""
    from experiments.compare import speed

    preset = PRESETS["smoke"]
    first, second = preset.speed.models[:2]
    measured = []
    monkeypatch.setattr(speed, "train_step_time", lambda cfg, T, *_: measured.append(cfg.model.name) or {"T": T})
    monkeypatch.setattr(speed, "decode_time", lambda *_: {})
    stale = {"recipe": {**speed.speed_recipe(first, preset), "overrides": ["model.head_dim=8"]}, "train": "stale"}
    kept = {"recipe": speed.speed_recipe(second, preset), "train": "kept"}
    results = speed.measure_speed(preset, {first: stale, second: kept})
    assert set(measured) == {first} and results[first]["train"] != "stale"
    assert results[first]["recipe"] == speed.speed_recipe(first, preset)
    assert results[second] is kept


def test_a_speed_result_whose_overrides_moved_into_an_experiment_file_is_kept():
    """long_cpu_16k's speed.json recorded each model's keys spelled out; the preset now names them through
    experiment=compare/cpu_model. The same config: kept by the speed stage and the report, not measured again;
    a changed key or speed setting still is."""
    from experiments.compare import speed

    preset = PRESETS["long_cpu_16k"]
    today = speed.speed_recipe("power", preset)
    assert "experiment=compare/cpu_model" in today["overrides"]
    spelled = [
        "model=power", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=4", "model.head_dim=16",
        "model.window=19", "model.conv_size=4", "model.qk_norm=true", "model.target_params=100000", "model.name=power",
    ]  # fmt: skip
    assert speed.same_recipe({**today, "overrides": spelled}, today)
    assert speed.reusable(preset, {"power": {"recipe": {**today, "overrides": spelled}}})
    assert not speed.same_recipe({**today, "overrides": [*spelled[:-1], "model.head_dim=8"]}, today)
    assert not speed.same_recipe({**today, "overrides": spelled, "repeats": today["repeats"] + 1}, today)
    assert not speed.same_recipe(None, today) and not speed.same_recipe("old", today)


def test_the_report_leaves_out_speed_measured_with_another_recipe(tmp_path, monkeypatch):
    """Speed results whose recorded recipe is not the preset's (a changed preset, a speed.json from before
    recipes were recorded) are not shown as the preset's: the report names them; with the recipes, it shows them."""
    committed = Path("results/compare/cpu").absolute()
    monkeypatch.chdir(tmp_path)  # no outputs/: the report reads no run's curves
    shutil.copy(committed / "quality.json", tmp_path / "quality.json")
    measured = json.loads((committed / "speed.json").read_text())
    recipes = {m: speed_recipe(m, PRESETS["cpu"]) for m in PRESETS["cpu"].speed.models}
    stale = {
        m: {**r, "recipe": {**recipes[m], "overrides": ["model.head_dim=8"]}} for m, r in measured["results"].items()
    }
    (tmp_path / "speed.json").write_text(json.dumps({**measured, "results": stale}))
    write_report(tmp_path, tmp_path / "REPORT.md", op_speed=None, speed_recipes=recipes)
    text = (tmp_path / "REPORT.md").read_text()
    assert f"Not shown for {', '.join(stale)}" in text and "Training step (forward, backward" not in text
    current = {m: {**r, "recipe": recipes[m]} for m, r in measured["results"].items()}
    (tmp_path / "speed.json").write_text(json.dumps({**measured, "results": current}))
    write_report(tmp_path, tmp_path / "REPORT.md", op_speed=None, speed_recipes=recipes)
    text = (tmp_path / "REPORT.md").read_text()
    assert "Not shown for" not in text and "Training step (forward, backward" in text


def test_the_report_command_leaves_out_speed_measured_with_another_recipe(tmp_path, monkeypatch):
    """`python -m experiments.compare.report <data>` checks speed.json against the recipes of the preset its JSON
    names, as run.py does: stale times are named, not tabled, and no speed.png is drawn from them."""
    from experiments.compare.report import main as report_main

    committed = Path("results/compare/cpu").absolute()
    monkeypatch.chdir(tmp_path)
    shutil.copy(committed / "quality.json", tmp_path / "quality.json")
    measured = json.loads((committed / "speed.json").read_text())
    stale = {m: {**r, "recipe": {"overrides": ["model.head_dim=8"]}} for m, r in measured["results"].items()}
    (tmp_path / "speed.json").write_text(json.dumps({**measured, "preset": "cpu", "results": stale}))
    report_main([str(tmp_path), "--out", str(tmp_path / "REPORT.md")])
    assert f"Not shown for {', '.join(stale)}" in (tmp_path / "REPORT.md").read_text()
    assert not (tmp_path / "speed.png").exists()


def test_a_run_folder_not_on_this_machine_has_no_curve(tmp_path):
    """The report of a quality.json whose runs are gone draws no curve for them (TensorBoard raised on the missing
    folder, so the whole report failed)."""
    from experiments.compare.runs import train_loss_curve

    assert train_loss_curve(tmp_path / "gone" / "tb") == []
