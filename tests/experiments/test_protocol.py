"""The protocol's machinery (experiments/compare/protocol.py, quality.py): best-lr choice, stage order, parts, filters
and resumption on fake run folders (no training), then one tiny comparison end to end: the files each run keeps,
the command that repeats it, the test eval (decode path, memory and time notes) and the report."""

import dataclasses
import json
import math
import shlex

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.compare import quality
from experiments.compare.evaluate import _forward_sums, decode_sums, evaluate_run, long_skip_note
from experiments.compare.models import compose_config, config_yaml
from experiments.compare.presets import SMOKE, TEST_OFFSET, Task
from experiments.compare.protocol import (
    Run,
    at_edge,
    best_lr,
    check_only,
    in_part,
    lr_grid,
    mean_range,
    parse_only,
    parse_part,
    selected,
)
from experiments.compare.quality import collect, run_overrides, run_stages, stage_jobs
from experiments.compare.report import write_report
from experiments.compare.runs import CONFIG, RECORD, SUMMARY, TEST, load_params
from retention.nn import LM
from retention.train.config import make_dataset, make_lm_config
from retention.train.step import SCALAR_SUMS

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration


def test_best_lr_prefers_the_better_then_the_smaller_and_waits_for_all():
    assert best_lr({1e-3: 0.5, 3e-3: 0.9, 1e-2: 0.7}, higher_is_better=True) == 3e-3
    assert best_lr({1e-3: 2.0, 3e-3: 1.5, 1e-2: 1.7}, higher_is_better=False) == 3e-3
    assert best_lr({1e-2: 0.4, 1e-3: 0.4}, higher_is_better=True) == 1e-3  # a tie: the smaller
    assert best_lr({1e-3: 0.1, 1e-2: math.nan}, higher_is_better=True) == 1e-3  # diverged: never best
    assert best_lr({1e-3: math.nan, 1e-2: math.inf}, higher_is_better=False) == 1e-3
    assert best_lr({1e-3: 0.1, 1e-2: None}, higher_is_better=True) is None  # a run still missing
    assert best_lr({1e-2: None}, higher_is_better=True) == 1e-2  # one rate: nothing to choose, nothing to wait for


def test_lr_grid_extends_past_the_edge_where_the_best_sits():
    """A best at the top of 1e-3..1e-2 adds 0.033 (the grid's ratio there, two digits); a second step only when
    allowed and the best is still at the edge; a loss's best at the bottom adds 0.00033 below; an interior best,
    a pending run or a one-rate grid adds nothing."""
    acc = {1e-3: 0.2, 3e-3: 0.4, 1e-2: 0.6, 0.033: 0.7, 0.11: 0.65}
    base = (1e-3, 3e-3, 1e-2)
    assert lr_grid(base, acc.get, True, 0) == base
    assert lr_grid(base, acc.get, True, 1) == (*base, 0.033)
    assert lr_grid(base, acc.get, True, 3) == (*base, 0.033, 0.11)  # 0.033 best, 0.11 not: it stops there
    loss = {1e-3: 1.0, 3e-3: 1.5, 1e-2: 2.0}
    assert lr_grid(base, loss.get, False, 2) == (0.00033, *base)  # 0.00033 not run yet: no further step
    assert lr_grid(base, {1e-3: 0.2, 3e-3: 0.9, 1e-2: 0.6}.get, True, 2) == base
    assert lr_grid(base, {1e-3: 0.2, 3e-3: 0.9}.get, True, 2) == base  # 1e-2 pending
    assert lr_grid((1e-2,), acc.get, True, 2) == (1e-2,)
    assert at_edge(base, 1e-2) and at_edge(base, 1e-3) and not at_edge(base, 3e-3) and not at_edge((1e-2,), 1e-2)


def test_mean_range():
    assert mean_range([0.2, 0.5, 0.8]) == (pytest.approx(0.5), 0.2, 0.8)


def test_parts_split_every_stage_without_overlap():
    parts = [[i for i in range(10) if in_part(i, (k, 3))] for k in (1, 2, 3)]
    assert sorted(sum(parts, [])) == list(range(10)) and all(parts)
    assert parse_part("2/4") == (2, 4)
    for bad in ("0/3", "4/3", "x", "1-2"):
        with pytest.raises(ValueError, match="--part must be k/n"):
            parse_part(bad)


def test_only_filters_jobs():
    only = parse_only(["task=mqar,passkey", "entry=power"])
    assert only == {"task": {"mqar", "passkey"}, "entry": {"power"}}
    assert selected(only, "sweep", Run("passkey", "power", 1e-2, 0))
    assert not selected(only, "sweep", Run("text", "power", 1e-2, 0))
    seeds = parse_only(["seed=1,2", "stage=seeds"])
    assert selected(seeds, "seeds", Run("text", "power", 1e-2, 2))
    assert not selected(seeds, "seeds", Run("text", "power", 1e-2, 0))
    assert not selected(seeds, "test", Run("text", "power", 1e-2, 1))
    with pytest.raises(ValueError, match="--only takes key=value"):
        parse_only(["model=power"])
    check_only(FAKE, parse_only(["task=mqar", "entry=power,softmax", "stage=seeds", "seed=0,5"]))  # all the preset's
    for bad, match in (("seed=1", r"--only seed=1: the \w+ preset has seed in \['0', '5'\]"), ("task=mqar_t9", "task")):
        with pytest.raises(ValueError, match=match):
            check_only(FAKE, parse_only([bad]))


FAKE = dataclasses.replace(
    SMOKE, tasks={"mqar": dataclasses.replace(SMOKE.tasks["mqar"], lrs=(1e-3, 3e-3, 1e-2), seeds=(0, 5))}
)


def fake_summary(folder, accuracy: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    summary = {"seq_len": 64, "eval": {"64": {"accuracy": accuracy}}, "layer_kinds": "PP", "params": 1, "steps": 3}
    (folder / SUMMARY).write_text(json.dumps(summary))


def test_seeds_wait_for_the_whole_sweep_then_run_at_the_best_lr(tmp_path):
    for lr, acc in ((1e-3, 0.2), (3e-3, 0.6)):
        fake_summary(Run("mqar", "power", lr, 0).folder(tmp_path), acc)
    assert not [r for r in stage_jobs(FAKE, tmp_path, "seeds") if r.entry == "power"]  # 1e-2 still missing
    fake_summary(Run("mqar", "power", 1e-2, 0).folder(tmp_path), 0.4)
    assert [r for r in stage_jobs(FAKE, tmp_path, "seeds") if r.entry == "power"] == [Run("mqar", "power", 3e-3, 5)]
    assert [r for r in stage_jobs(FAKE, tmp_path, "test") if r.entry == "power"] == [Run("mqar", "power", 3e-3, 0)]
    # ablations report the first seed only; the quantized-cache entry follows its base (softmax: not swept yet)
    assert not [r for r in stage_jobs(FAKE, tmp_path, "seeds") if r.entry in ("power_nogate", "softmax_kv4")]


def test_a_one_rate_grid_runs_its_other_seeds_without_waiting_for_the_first(tmp_path, monkeypatch):
    """One learning rate and no extensions: nothing to choose, so the seeds stage has the other seeds before the
    first seed's run exists (a call with `--only seed=5` trains them alone, no seed 0), and its test eval waits for
    each."""
    one_rate = dataclasses.replace(FAKE, tasks={"mqar": dataclasses.replace(FAKE.tasks["mqar"], lrs=(1e-2,))})
    assert [r for r in stage_jobs(one_rate, tmp_path, "seeds") if r.entry == "power"] == [Run("mqar", "power", 1e-2, 5)]
    assert not [r for r in stage_jobs(one_rate, tmp_path, "test") if r.entry == "power"]
    fake_summary(Run("mqar", "power", 1e-2, 5).folder(tmp_path), 0.7)
    assert [r for r in stage_jobs(one_rate, tmp_path, "test") if r.entry == "power"] == [Run("mqar", "power", 1e-2, 5)]
    trained = []
    for stage in quality.STAGES:
        monkeypatch.setitem(quality.STAGES, stage, lambda preset, run, runs: trained.append(run))
    run_stages(one_rate, tmp_path, only=parse_only(["seed=5", "entry=softmax,power", "stage=sweep,seeds"]))
    assert sorted(trained, key=lambda r: r.entry) == [Run("mqar", e, 1e-2, 5) for e in ("power", "softmax")]


def test_a_seeded_entry_gets_every_seed_as_the_headline_does(tmp_path):
    """An ablation reports its first seed only, unless the preset names it in `seeded`."""
    for lr, acc in ((1e-3, 0.2), (3e-3, 0.6), (1e-2, 0.4)):
        fake_summary(Run("mqar", "power_nogate", lr, 0).folder(tmp_path), acc)
    assert not [r for r in stage_jobs(FAKE, tmp_path, "seeds") if r.entry == "power_nogate"]
    seeded = dataclasses.replace(FAKE, seeded=("power_nogate",))
    assert [r for r in stage_jobs(seeded, tmp_path, "seeds") if r.entry == "power_nogate"] == [
        Run("mqar", "power_nogate", 3e-3, 5)
    ]
    with pytest.raises(ValueError, match="seeded must name entries of the preset .*, got 'power_deg9'"):
        dataclasses.replace(FAKE, seeded=("power_deg9",))


def test_a_best_at_the_edge_extends_the_sweep_before_the_seeds(tmp_path):
    """power's best of 1e-3..1e-2 is 1e-2: the extend stage trains 0.033 (first seed) and the seeds wait for it;
    once 0.033 is worse, the seeds run at 1e-2 and nothing is left to extend."""
    for lr, acc in ((1e-3, 0.2), (3e-3, 0.4), (1e-2, 0.6)):
        fake_summary(Run("mqar", "power", lr, 0).folder(tmp_path), acc)
    assert [r for r in stage_jobs(FAKE, tmp_path, "extend") if r.entry == "power"] == [Run("mqar", "power", 0.033, 0)]
    assert not [r for r in stage_jobs(FAKE, tmp_path, "seeds") if r.entry == "power"]
    fake_summary(Run("mqar", "power", 0.033, 0).folder(tmp_path), 0.5)
    assert not [r for r in stage_jobs(FAKE, tmp_path, "extend") if r.entry == "power"]
    assert [r for r in stage_jobs(FAKE, tmp_path, "seeds") if r.entry == "power"] == [Run("mqar", "power", 1e-2, 5)]


def test_a_call_counts_the_jobs_it_leaves_never_those_it_finished(tmp_path, monkeypatch):
    """The extend stage's job list drops a run once it is finished: a call that trains power's one extension leaves
    0 extend jobs (it said -1), and the sweep's other entries are counted as left to other calls."""
    for lr, acc in ((1e-3, 0.2), (3e-3, 0.4), (1e-2, 0.6)):
        fake_summary(Run("mqar", "power", lr, 0).folder(tmp_path), acc)
    finish = lambda preset, run, runs: fake_summary(run.folder(runs), 0.5)
    for stage in quality.STAGES:
        monkeypatch.setitem(quality.STAGES, stage, finish)
    left = run_stages(FAKE, tmp_path, only=parse_only(["entry=power", "stage=extend"]))
    assert (Run("mqar", "power", 0.033, 0).folder(tmp_path) / SUMMARY).exists()
    assert left["extend"] == 0 and left["sweep"] == len(stage_jobs(FAKE, tmp_path, "sweep"))


def finished_test(preset, entry: str) -> dict:
    """A test.json as the preset reads it today: its long length (1,024) skipped as the preset says, or read on
    its long_min_queries (a trained entry; a quantized one has no long length)."""
    if not preset.entries[entry].trained:
        return {"64": {"accuracy": 0.5}}
    note = long_skip_note(preset, entry)
    long = {"skipped": note} if note else {"accuracy": 0.5, "queries": preset.tasks["mqar"].long_min_queries}
    return {"64": {"accuracy": 0.5}, "1024": long}


def test_finished_runs_are_reused_not_retrained(tmp_path, monkeypatch):
    """Folders with summary.json (and test.json) are read back: a call that would train or evaluate fails."""
    for run in stage_jobs(FAKE, tmp_path, "sweep"):
        fake_summary(run.folder(tmp_path), 0.5)
    for stage in ("extend", "seeds", "test"):
        for run in stage_jobs(FAKE, tmp_path, stage):
            fake_summary(run.folder(tmp_path), 0.5)
        for run in stage_jobs(FAKE, tmp_path, stage):
            if stage == "test":
                (run.folder(tmp_path) / TEST).write_text(json.dumps(finished_test(FAKE, run.entry)))
    monkeypatch.setattr(quality, "train", lambda *a: pytest.fail("retrained a finished run"))
    monkeypatch.setattr(quality, "evaluate_run", lambda *a: pytest.fail("re-evaluated a finished run"))
    for k in (1, 2):
        run_stages(FAKE, tmp_path, part=(k, 2))


def test_a_long_length_read_otherwise_is_evaluated_again(tmp_path, monkeypatch):
    """A finished test eval's long length runs again (only it; the rest kept) where it read fewer queries than the
    task asks now (or has no count), where the preset now leaves the entry out there (softmax: measured before),
    or left out for time where the preset no longer does; a memory skip and a read on enough queries stay."""
    asked = []

    def evaluate(preset, run, cfg, source, lengths):
        asked.append((run.entry, lengths))
        return {str(L): {"accuracy": 1.0, "queries": 99} for L in lengths}

    monkeypatch.setattr(quality, "evaluate_run", evaluate)
    runs = {e: Run("mqar", e, 1e-2, 0) for e in ("power", "softmax", "swa_matched")}
    for run in runs.values():
        fake_summary(run.folder(tmp_path), 0.5)
    old = {"64": {"accuracy": 0.25}, "1024": {"accuracy": 0.5, "sequences": 2}}  # 8 queries, uncounted
    for entry, long in (("power", None), ("softmax", None), ("swa_matched", {"skipped": "not run: time"})):
        done = old if long is None else {**old, "1024": long}
        (runs[entry].folder(tmp_path) / TEST).write_text(json.dumps(done))
    new = {"64": old["64"], "1024": {"accuracy": 1.0, "queries": 99}}
    assert [quality.test_run(FAKE, runs[e], tmp_path) for e in runs] == [new] * 3  # the rest kept as it was
    assert asked == [("power", [1024]), ("softmax", [1024]), ("swa_matched", [1024])]
    for entry, long in (("power", {"accuracy": 0.5, "queries": 8}), ("swa_matched", {"skipped": "not run: memory"})):
        (runs[entry].folder(tmp_path) / TEST).write_text(json.dumps({**old, "1024": long}))
        quality.test_run(FAKE, runs[entry], tmp_path)
    assert len(asked) == 3  # 8 queries are smoke's long_min_queries; a memory skip stays


CARRY = dataclasses.replace(  # two entries on one task
    FAKE,
    entries={k: FAKE.entries[k] for k in ("softmax", "power")},
    headline=("softmax", "power"),
    ablations=(),
    frontier=(),
    frontier_tasks=(),
)


def fake_run(runs, preset, run: Run, accuracy: float) -> None:
    """A finished run's folder: its summary, its compare.json with the overrides the preset gives it and the
    resolved config.yaml they compose to (as `quality.train_run` writes them)."""
    fake_summary(run.folder(runs), accuracy)
    overrides = [*run_overrides(preset, run), "trainer.peak_flops=1"]
    (run.folder(runs) / RECORD).write_text(json.dumps({**run.fields(), "overrides": overrides}))
    (run.folder(runs) / CONFIG).write_text(config_yaml(compose_config(overrides)))


def test_a_task_without_run_folders_is_carried_over_from_the_previous_collect(tmp_path):
    """The runs of a task none of whose folders is here come from the previous quality.json, marked, with the
    learning rates they were run at, also when the recorded overrides write today's config another way (a recipe
    moved into its experiment file); never when the preset's recipe for the run (the config its overrides compose
    to, or the model they resolve to) changed since, and never mixed with an entry's runs found in folders (the
    task's other entries still carried)."""
    runs, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    for run in stage_jobs(CARRY, runs, "sweep"):
        fake_run(runs, CARRY, run, 0.8 if run.lr == 3e-3 else 0.5)
    for run in stage_jobs(CARRY, runs, "seeds"):
        fake_run(runs, CARRY, run, 0.7)
    first = collect(CARRY, runs)
    finished = {(r["task"], r["entry"], r["lr"], r["seed"]): r for r in first["runs"] if r["summary"]}
    assert len(finished) == 2 * 3 + 2  # softmax and power: three lrs, then the second seed at 3e-3
    assert not [r for r in collect(CARRY, elsewhere)["runs"] if r["summary"]]  # nothing without `previous`
    second = collect(CARRY, elsewhere, previous=first)
    carried = {(r["task"], r["entry"], r["lr"], r["seed"]): r for r in second["runs"] if r["summary"]}
    assert carried.keys() == finished.keys() and all(r["carried_over"] for r in carried.values())
    assert all(carried[k]["summary"] == finished[k]["summary"] for k in finished)
    assert second["tasks"]["mqar"]["entry_lrs"] == first["tasks"]["mqar"]["entry_lrs"]
    written_otherwise = {  # the experiment's data group named again on the command line: the same config
        **first,
        "runs": [
            {**r, "record": {**r["record"], "overrides": ["data=mqar", *r["record"]["overrides"]]}}
            for r in first["runs"]
        ],
    }
    rewritten = {
        (r["task"], r["entry"], r["lr"], r["seed"])
        for r in collect(CARRY, elsewhere, previous=written_otherwise)["runs"]
        if r.get("carried_over")
    }
    assert rewritten == finished.keys()
    task = dataclasses.replace(CARRY.tasks["mqar"], overrides=("trainer.steps=7",))
    longer = dataclasses.replace(CARRY, tasks={"mqar": task})
    assert not [r for r in collect(longer, elsewhere, previous=first)["runs"] if r["summary"]]  # another recipe
    recipe_changed = {**first, "runs": [{**r, "model": {**r["model"], "decay_init": "paper"}} for r in first["runs"]]}
    assert not [r for r in collect(CARRY, elsewhere, previous=recipe_changed)["runs"] if r["summary"]]
    unrecorded = {**first, "runs": [{k: v for k, v in r.items() if k != "model"} for r in first["runs"]]}
    carried = [r for r in collect(CARRY, elsewhere, previous=unrecorded)["runs"] if r["summary"]]
    assert {r["entry"] for r in carried} == {"softmax"}  # A's defaults are unchanged; P's are not (RoPE off)
    fake_run(elsewhere, CARRY, Run("mqar", "power", 1e-3, 0), 0.1)  # power ran here: read from its folders
    mixed = [r for r in collect(CARRY, elsewhere, previous=first)["runs"] if r["summary"]]
    assert [(r["lr"], r.get("carried_over")) for r in mixed if r["entry"] == "power"] == [(1e-3, None)]
    softmax = {(r["lr"], r["seed"]) for r in mixed if r["entry"] == "softmax" and r["carried_over"]}
    assert softmax == {k[2:] for k in finished if k[1] == "softmax"}


def test_a_quantized_evaluation_is_carried_with_its_base_run(tmp_path):
    """A quantized state's test evals (no model of their own) are kept from the previous quality.json when their
    base's runs are (they were dropped: no model section, and P's defaults changed since the first records), and
    dropped with them when the base's recipe changed."""
    entries = {k: FAKE.entries[k] for k in ("softmax", "power", "power_state_fp8")}
    preset = dataclasses.replace(CARRY, entries=entries, frontier=("power_state_fp8",), frontier_tasks=("mqar",))
    runs, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    for run in stage_jobs(preset, runs, "sweep"):
        fake_run(runs, preset, run, 0.8 if run.lr == 3e-3 else 0.5)
    for run in stage_jobs(preset, runs, "seeds"):
        fake_run(runs, preset, run, 0.7)
    for run in stage_jobs(preset, runs, "test"):
        if run.entry == "power_state_fp8":  # as test_run writes an evaluation's folder
            run.folder(runs).mkdir(parents=True)
            (run.folder(runs) / RECORD).write_text(
                json.dumps({**run.fields(), "overrides": run_overrides(preset, run)})
            )
            (run.folder(runs) / TEST).write_text(json.dumps({"64": {"accuracy": 0.6}}))
    evaluations = lambda result, carried: {
        (r["lr"], r["seed"])
        for r in result["runs"]
        if r["entry"] == "power_state_fp8" and r["test"] and bool(r.get("carried_over")) == carried
    }
    first = collect(preset, runs)
    assert evaluations(first, carried=False) == {(3e-3, 0), (3e-3, 5)}
    assert evaluations(collect(preset, elsewhere, previous=first), carried=True) == {(3e-3, 0), (3e-3, 5)}
    changed = [{**r, "model": {**r["model"], "decay_init": "paper"}} if r["model"] else r for r in first["runs"]]
    assert not evaluations(collect(preset, elsewhere, previous={**first, "runs": changed}), carried=True)


TINY_TASK = Task(
    "mqar",
    SMOKE.tasks["mqar"].experiment,
    lrs=(1e-2,),
    seeds=(0,),
    test_scales=(1,),
    long_lengths=(256,),
    test_batches=1,
    test_tokens=256,
    decode_chunk=16,
)
TINY_T32 = dataclasses.replace(  # the frontier's second training length: softmax and its 4-bit cache
    TINY_TASK,
    overrides=("data.seq_len=32", "data.min_gap=8"),
    skip=("power", "mamba2"),
)
TINY = dataclasses.replace(
    SMOKE,
    entries={k: SMOKE.entries[k] for k in ("softmax", "power", "softmax_kv4", "power_state_fp8", "mamba2")},
    headline=("softmax", "power"),
    ablations=(),
    frontier=("softmax_kv4", "power_state_fp8", "mamba2"),  # a quantized state, a registry mixer beside power
    frontier_tasks=("mqar", "mqar_t32"),
    tasks={"mqar": TINY_TASK, "mqar_t32": TINY_T32},
    long_eval_skip={"softmax": "time on this machine"},
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny comparison run once: its runs folder."""
    runs = tmp_path_factory.mktemp("runs")
    assert run_stages(TINY, runs) == {"sweep": 0, "extend": 0, "seeds": 0, "test": 0}
    return runs


@pytest.mark.xdist_group("tiny_comparison")  # one worker runs the `tiny` fixture, once
def test_each_run_keeps_its_config_command_summary_and_test(tiny):
    folder = Run("mqar", "power", 1e-2, 0).folder(tiny)
    record = json.loads((folder / RECORD).read_text())
    words = shlex.split(record["command"])
    assert words[:2] == ["python", "train.py"] and words[-1] == f"hydra.run.dir={folder}"
    assert config_yaml(compose_config(words[2:-1])) == (folder / CONFIG).read_text()  # the command repeats it
    assert record["overrides"] == [*run_overrides(TINY, Run("mqar", "power", 1e-2, 0)), f"trainer.peak_flops={3.24e11}"]
    test = json.loads((folder / TEST).read_text())
    assert set(test) == {"64", "256"} and 0 <= test["256"]["accuracy"] <= 1 and test["256"]["eval_bytes"] > 0
    assert json.loads((folder / SUMMARY).read_text())["steps"] == 3
    for run in (Run("mqar", "power", 1e-2, 0), Run("mqar", "softmax_kv4", 1e-2, 0)):  # trained, and evaluated only
        record = json.loads((run.folder(tiny) / RECORD).read_text())
        assert record["test_wall_s"] > 0 and record["test_cpu_s"] > 0, run  # the estimate's test seconds


@pytest.mark.xdist_group("tiny_comparison")  # one worker runs the `tiny` fixture, once
def test_long_lengths_left_out_are_marked(tiny):
    test = json.loads((Run("mqar", "softmax", 1e-2, 0).folder(tiny) / TEST).read_text())
    assert test["256"] == {"skipped": "not run: time on this machine"} and "accuracy" in test["64"]
    for entry in ("softmax_kv4", "power_state_fp8"):
        quantized = json.loads((Run("mqar", entry, 1e-2, 0).folder(tiny) / TEST).read_text())
        assert set(quantized) == {"64"}  # the frontier reads the training length
    squeezed = dataclasses.replace(TINY, long_eval_bytes=1)
    cfg = compose_config(run_overrides(TINY, Run("mqar", "power", 1e-2, 0)))
    out = evaluate_run(squeezed, Run("mqar", "power", 1e-2, 0), cfg, Run("mqar", "power", 1e-2, 0).folder(tiny))
    assert all(v["skipped"].startswith("not run: memory") for v in out.values())


@pytest.mark.xdist_group("tiny_comparison")  # one worker runs the `tiny` fixture, once
def test_decode_eval_with_a_float_cache_equals_the_forward(tiny):
    """The decode path of the quantized-cache eval, run with a float cache, gives the full forward's sums."""
    run = Run("mqar", "softmax", 1e-2, 0)
    cfg = compose_config(run_overrides(TINY, run))
    lm = make_lm_config(cfg.model, make_dataset(cfg.data, 0).vocab_size)
    params = load_params(run.folder(tiny), cfg.trainer.steps)
    model = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(0)))), params)
    b = make_dataset(dataclasses.replace(cfg.data, batch_size=3), 0).batch(TEST_OFFSET, seq_len=64, split="eval")
    inputs, targets = jnp.asarray(b.inputs), jnp.asarray(b.targets)
    full = _forward_sums(nnx.graphdef(model), params, inputs, targets)
    stepped = decode_sums(model, inputs, targets, chunk=16)
    assert set(stepped) == set(full)  # the per-position sums too
    for key in SCALAR_SUMS:
        assert float(stepped[key]) == pytest.approx(float(full[key]), rel=1e-5), key
    np.testing.assert_allclose(stepped["nll_T"], full["nll_T"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(stepped["labels_T"], full["labels_T"])


@pytest.mark.xdist_group("tiny_comparison")  # one worker runs the `tiny` fixture, once
def test_collect_and_report(tiny, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    meta = {"preset": "tiny", "command": "test", "machine": {"device": "cpu", "backend": "cpu", "devices": 1}}
    meta["machine"].update(cpus=2, jax="0", date="today")
    quality = collect(TINY, tiny)
    trained = [r for r in quality["runs"] if r["summary"]]
    assert trained and all(0 < r["train_curve"][-1][0] <= r["summary"]["steps"] for r in trained)  # (step, s, loss)
    (data / "quality.json").write_text(json.dumps({**meta, **quality}))
    write_report(data, tmp_path / "REPORT.md", op_speed=None)
    text = (tmp_path / "REPORT.md").read_text()
    assert "No training-loss curve" not in text
    assert "| softmax (AA, RoPE) |" in text and "not run: time on this machine" in text  # with its recipe
    assert "### mqar: trained at T=64" in text and "### mqar_t32: trained at T=32" in text
    assert "| softmax_kv4 (AA, RoPE, KV 4-bit) |" in text[text.index("### mqar_t32") :]
    assert (
        "| power_state_fp8 (PP, no RoPE, degree 2, state fp8) |"
        in text[text.index("### mqar: trained") : text.index("### mqar_t32: trained")]
    )
    assert "power_state_fp8" not in TINY.task_entries("mqar_t32")  # its base is left out there
    assert "| mamba2 (MM, long decay init) |" in text
    by_length = quality["tasks"]["mqar"]["cache_bytes_by_length"]
    assert by_length["power_state_fp8"]["64"] < by_length["power"]["64"] / 2  # rows of 8: 8 + 4 bytes, not 32
