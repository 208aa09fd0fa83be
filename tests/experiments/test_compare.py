"""The comparison pipeline (experiments/compare): the memory-matched window, the presets' configs, the reuse of
finished runs, and the train-step timer on the trainer's own step."""

import json

import numpy as np
import pytest

from experiments.compare.models import compose_config, lm_cache_bytes, matched_window, model_overrides
from experiments.compare.presets import CPU, GPU, PRESETS, SMOKE, Preset
from experiments.compare.quality import measure_quality, run_dir
from experiments.compare.speed import train_step_time
from retention.train.config import build


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
    for preset in PRESETS.values():
        for task in preset.tasks.values():
            overrides = [*model_overrides("hybrid", preset, 64), *task.model_overrides("hybrid"), f"data={task.data}"]
            lm, _ = build(compose_config([*overrides, *task.overrides]))
            assert set(lm.layer_kinds) == {"P", "A"}, lm.layer_kinds  # a hybrid at every task's depth
        assert all(preset.tokens_per_step % T == 0 for T in preset.speed_lengths)


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="model must be one of"):
        model_overrides("mamba", SMOKE, 8)


def test_finished_runs_are_reused_not_retrained(tmp_path):
    """A run folder with a summary.json is read back: no training happens (the summaries are not runnable)."""
    mqar_only = {"tasks": {"mqar": SMOKE.tasks["mqar"]}, "models": ("power", "softmax"), "seeds": (0, 3)}
    preset = Preset(**{**SMOKE.__dict__, **mqar_only})
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
