"""The comparison's presets and entries (experiments/compare): every preset's configs pass the trainer's checks, the
matched window holds the power state's bytes and cannot reach any MQAR key, the demo's window reaches no key of
its far cell, and the train-step timer runs the trainer's step."""

import dataclasses
import functools
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from experiments.compare.models import (
    compose_config,
    entry_overrides,
    lm_cache_bytes,
    matched_window,
)
from experiments.compare.presets import PRESETS, SMOKE
from experiments.compare.protocol import Run
from experiments.compare.quality import run_overrides
from experiments.compare.runs import METRICS
from experiments.compare.speed import train_step_time
from experiments.hydra_run import with_overrides
from retention.configs import CONFIG_DIR
from retention.train.config import build, make_dataset
from tests.data.test_mqar_min_gap import query_distances

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration

CASES = [(p, t, e) for p in PRESETS.values() for t in p.tasks for e in p.task_entries(t)]
PRESET_CONFIGS = pytest.mark.xdist_group("preset_configs")  # one worker composes each config once (a Hydra
# composition is about 0.3 s: the preset tests below compose the same 107)


@functools.cache
def first_run_config(preset_name: str, task: str, entry: str):
    """The composed config of the entry's first run (first lr and seed) on the preset's task."""
    preset = PRESETS[preset_name]
    spec = preset.tasks[task]
    return compose_config(run_overrides(preset, Run(task, entry, spec.lrs[0], spec.seeds[0])))


@PRESET_CONFIGS
@pytest.mark.parametrize("preset,task,entry", CASES, ids=lambda x: x if isinstance(x, str) else x.name)
def test_every_preset_config_passes_the_trainer_checks(preset, task, entry):
    """Each entry on each task composes and builds (the trainer's value checks, eval lengths included)."""
    lm, _ = build(first_run_config(preset.name, task, entry))
    if entry.startswith("hybrid"):
        assert set(lm.layer_kinds) == {"P", "A"}, lm.layer_kinds
    assert lm.kv_cache_bits == preset.entries[entry].kv_cache_bits


@PRESET_CONFIGS
@pytest.mark.parametrize("preset", PRESETS.values(), ids=lambda p: p.name)
def test_every_task_gives_each_entry_the_same_tokens(preset):
    for task in preset.tasks:
        sizes = set()
        for entry in preset.task_entries(task):
            cfg = first_run_config(preset.name, task, entry)
            sizes.add((cfg.trainer.steps, cfg.data.batch_size, cfg.data.seq_len))
        assert len(sizes) == 1, (task, sizes)
    if preset.speed:
        assert all(preset.speed.tokens_per_step % T == 0 for T in preset.speed.lengths)


MQAR_CASES = [
    (p, t)
    for p in PRESETS.values()
    for t, spec in p.tasks.items()
    if spec.data == "mqar" and "swa_matched" in p.task_entries(t)
]


@pytest.mark.parametrize("preset,task", MQAR_CASES, ids=lambda x: x if isinstance(x, str) else x.name)
def test_matched_window_holds_the_state_bytes_and_reaches_no_key(preset, task):
    """swa_matched's cache has the power model's bytes less than one token's; its layers' combined reach
    n_layers * (window - 1 + conv_size - 1) is shorter than every query's distance to its key, except on the cpu
    preset's cell, where head dim 16's state holds a window longer than the sequence (the W entry is the window
    that reaches no key there: the demo's, test_the_demo_window_reaches_no_key_of_the_far_cell)."""
    spec = preset.tasks[task]
    cfg = {e: compose_config(run_overrides(preset, Run(task, e, 1e-3, 0))) for e in ("power", "swa_matched")}
    softmax = compose_config(entry_overrides("softmax", preset, task))
    window = matched_window(preset, task)
    assert cfg["swa_matched"].model.window == window and cfg["swa_matched"].model.pattern == "W"
    per_token = lm_cache_bytes(softmax, 2) - lm_cache_bytes(softmax, 1)
    state, ring = lm_cache_bytes(cfg["power"], 65536), lm_cache_bytes(cfg["swa_matched"], 65536)
    assert lm_cache_bytes(cfg["power"], 7) == state  # the state does not grow
    assert 0 <= state - ring < per_token, (state, ring, per_token)
    data = make_dataset(dataclasses.replace(cfg["power"].data, batch_size=64), 0)
    conv = getattr(cfg["swa_matched"].model, "conv_size", 0)  # a short convolution reaches conv_size - 1 back
    reach = cfg["swa_matched"].model.n_layers * (window - 1 + max(conv - 1, 0))
    if preset.name == "cpu":
        assert window > cfg["power"].data.seq_len
        return
    for scale in spec.test_scales:
        L = scale * cfg["power"].data.seq_len
        assert query_distances(data.batch(0, seq_len=L, split="eval"), data.num_kv_pairs).min() > reach


def test_the_demo_window_reaches_no_key_of_the_far_cell():
    """configs/experiment/mqar_demo.yaml's W model (its sweep's pattern W): its layers' reach, window and
    short convolution, is shorter than every query's distance to its key on the far cell (the YAML's min_gap), and
    its KV cache holds fewer bytes than its P model's state (the window is no larger than the fixed state)."""
    demo = ["experiment=mqar_demo"]
    power, swa = (compose_config([*demo, f"model.pattern={p}"]) for p in "PW")
    assert power.model.conv_size == swa.model.conv_size == 4 and power.model.qk_norm and swa.model.qk_norm
    assert lm_cache_bytes(swa, 4096) < lm_cache_bytes(power, 1)
    data = make_dataset(dataclasses.replace(power.data, batch_size=64), 0)
    reach = swa.model.n_layers * (swa.model.window - 1 + swa.model.conv_size - 1)
    assert query_distances(data.batch(0, split="eval"), data.num_kv_pairs).min() > reach


def test_unknown_entry_is_refused():
    with pytest.raises(ValueError, match="entry must be one of"):
        entry_overrides("mamba", SMOKE)


def test_train_step_time_runs_the_trainer_step():
    """The timer compiles the trainer's step once and reports consistent throughput and XLA memory figures."""
    cfg = compose_config(entry_overrides("power", SMOKE))
    r = train_step_time(cfg, T=48, B=3, repeats=2, peak_flops=1e11)
    assert (r["T"], r["batch"]) == (48, 3) and len(r["times_s"]) == 2
    assert r["step_s"] == pytest.approx(float(np.median(r["times_s"])))
    assert r["tokens_per_s"] == pytest.approx(3 * 48 / r["step_s"])
    assert r["temp_bytes"] > 0 and r["argument_bytes"] > 0


@pytest.mark.parametrize("entry, pattern", [("softmax", "A"), ("swa", "W"), ("power", "P"), ("hybrid", "PA")])
def test_the_demo_preset_is_the_demo(entry, pattern):
    """The comparison's `demo` preset runs experiment=mqar_demo's cell (compare/demo.yaml includes it): each entry's
    run is the demo sweep's run of that pattern (model, data, optimiser and steps alike; only the name differs)."""
    demo = PRESETS["demo"]
    run = compose_config(run_overrides(demo, Run("mqar", entry, demo.tasks["mqar"].lrs[0], 0)))
    sweep = compose_config(["experiment=mqar_demo", f"model.pattern={pattern}"])
    strip = lambda model: {k: v for k, v in dataclasses.asdict(model).items() if k != "name"}
    assert strip(run.model) == strip(sweep.model) and run.model.pattern == pattern
    assert dataclasses.asdict(run.data) == dataclasses.asdict(sweep.data) and run.optim == sweep.optim
    assert (run.trainer.steps, run.trainer.eval_scales) == (sweep.trainer.steps, sweep.trainer.eval_scales)
    assert run.seed == sweep.seed


EXPERIMENTS = Path(CONFIG_DIR) / "experiment"


def composed_choices(overrides: list[str]) -> dict:
    """The config group choices of config.yaml composed with `overrides`, as `python train.py` composes it."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return dict(compose("config", overrides=overrides, return_hydra_config=True).hydra.runtime.choices)


@pytest.mark.parametrize(
    "name", sorted(str(p.relative_to(EXPERIMENTS).with_suffix("")) for p in EXPERIMENTS.rglob("*.yaml"))
)
def test_every_experiment_file_composes_with_the_trainer_config(name):
    """`python train.py experiment=<name>` composes for every experiment file (the comparison's cells and their
    parts included): config.yaml with it, typed by the trainer's schema, so a misspelt key fails here."""
    assert compose_config([f"experiment={name}"]).model.name


@pytest.mark.parametrize("preset", PRESETS.values(), ids=lambda p: p.name)
def test_every_task_experiment_sets_its_data(preset):
    """A task's experiment file sets the data group the protocol reads the task by (its metric: runs.METRICS)."""
    for name, task in preset.tasks.items():
        assert composed_choices([f"experiment={task.experiment}"])["data"] == task.data, (preset.name, name)


def test_with_overrides_changes_by_key():
    """A change replaces its key's entry in place or is appended; "~key" removes it; removing an absent key is
    refused."""
    base = ("model.n_layers=8", "model.head_dim=64", "model.dtype=bfloat16")
    assert with_overrides(base, "model.n_layers=4", "model.deg=4", "~model.dtype") == (
        "model.n_layers=4",
        "model.head_dim=64",
        "model.deg=4",
    )
    with pytest.raises(ValueError, match="removes 'model.window'"):
        with_overrides(base, "~model.window")


def test_every_task_of_every_preset_has_its_metric():
    """The protocol picks lrs and reads results by the task's data (runs.METRICS): a preset's task on data without
    one (long_text, before) trains its sweep and then stops with a KeyError before any lr is chosen."""
    for preset in PRESETS.values():
        for name, task in preset.tasks.items():
            assert task.data in METRICS, (preset.name, name, task.data)
