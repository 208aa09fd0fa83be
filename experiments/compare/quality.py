"""Quality of the compared entries: the protocol's stages (experiments/compare/protocol.py) run with the trainer.

Every run writes under `<runs>/<task>/<entry>/lr<lr>/seed<k>/`: the trainer's files (TensorBoard events in tb/, so
`tensorboard --logdir <runs>` shows the whole comparison; checkpoints; summary.json), config.yaml (the resolved
config), compare.json (the run's overrides, the exact `python train.py ...` command that repeats it, its training's
wall and CPU seconds and its test eval's, `test_wall_s` and `test_cpu_s`, summed over the evals a stale length
made) and, at the best learning rate, test.json (the test eval). A finished run is never redone, so an interrupted
comparison resumes where it stopped; `collect` gathers every run's files into quality.json for the report.
"""

import contextlib
import logging
import shlex
import time
import zlib
from pathlib import Path

from tqdm import tqdm

from experiments.compare.evaluate import evaluate_run, stale_lengths
from experiments.compare.models import (
    compose_config,
    config_yaml,
    entry_overrides,
    lm_cache_bytes,
    matched_window,
    model_section,
    resolved_model,
)
from experiments.compare.presets import Preset
from experiments.compare.protocol import (
    STAGE_NAMES,
    Run,
    best_lr,
    in_part,
    lr_grid,
    seeds_of,
    selected,
    sweep_runs,
    trained_entry,
)
from experiments.compare.runs import (
    CONFIG,
    METRICS,
    RECORD,
    SUMMARY,
    TEST,
    read_json,
    selection_value,
    timed,
    train_loss_curve,
    write_json,
)
from retention.train import train

log = logging.getLogger(__name__)


@contextlib.contextmanager
def run_log(path: Path):
    """Within the block, INFO and above also go to `path` (each run's train.log, as train.py writes it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def run_overrides(preset: Preset, run: Run) -> list[str]:
    """Every override of the run, in train.py's syntax: the entry's model and its task's experiment (data, optimiser,
    trainer), the task's own overrides, lr, seed."""
    model = entry_overrides(run.entry, preset, run.task)
    return [*model, *preset.tasks[run.task].overrides, f"optim.lr={run.lr:g}", f"seed={run.seed}"]


def train_command(overrides: list[str], folder: Path) -> str:
    """The command that repeats the run by hand."""
    return shlex.join(["python", "train.py", *overrides, f"hydra.run.dir={folder}"])


def train_run(preset: Preset, run: Run, runs: Path) -> dict:
    """Train the run (or read back its summary when finished); returns summary.json."""
    folder = run.folder(runs)
    if (summary := read_json(folder / SUMMARY)) is not None:
        return summary
    overrides = [*run_overrides(preset, run), f"trainer.peak_flops={preset.peak_flops}"]
    cfg = compose_config(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(config_yaml(cfg))
    record = {**run.fields(), "overrides": overrides, "command": train_command(overrides, folder)}
    write_json(folder / RECORD, record)
    start, cpu = time.perf_counter(), time.process_time()
    with run_log(folder / "train.log"):
        summary = train(cfg, str(folder))
    seconds = {"wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}  # cpu: all threads
    write_json(folder / RECORD, {**record, **seconds})
    return summary


def sweep_value(preset: Preset, runs: Path, task: str, entry: str, lr: float) -> float | None:
    """The selection value of the entry's first-seed run at `lr` (None while unfinished)."""
    spec = preset.tasks[task]
    summary = read_json(Run(task, entry, lr, spec.seeds[0]).folder(runs) / SUMMARY)
    return None if summary is None else selection_value(summary, spec.data)


def entry_lrs(preset: Preset, runs: Path, task: str, entry: str) -> tuple[float, ...]:
    """The trained entry's learning rates on `task`: the task's grid, extended past an edge where its best sits
    (protocol.lr_grid) as far as its finished runs say."""
    spec = preset.tasks[task]
    value = lambda lr: sweep_value(preset, runs, task, entry, lr)
    return lr_grid(spec.lrs, value, METRICS[spec.data].higher_is_better, spec.lr_extensions)


def lr_choice(preset: Preset, runs: Path, task: str, entry: str) -> float | None:
    """The entry's best learning rate on `task` from its finished sweep runs, or None while any is unfinished
    (its grid's extensions included); a grid of one rate (no extensions: `lr_grid`) is its choice at once."""
    grid = entry_lrs(preset, runs, task, entry)
    values = {lr: sweep_value(preset, runs, task, entry, lr) for lr in grid}
    return best_lr(values, METRICS[preset.tasks[task].data].higher_is_better)


def extension_runs(preset: Preset, runs: Path) -> list[Run]:
    """Every trained entry's first-seed runs at the learning rates its grid's extensions added."""
    return [
        Run(task, entry, lr, spec.seeds[0])
        for task, spec in preset.tasks.items()
        for entry in preset.task_entries(task)
        if preset.entries[entry].trained
        for lr in entry_lrs(preset, runs, task, entry)
        if lr not in spec.lrs
    ]


def best_runs(preset: Preset, runs: Path) -> list[Run] | None:
    """Every run at its entry's best learning rate (all reported seeds), for the entries whose sweep is done."""
    out = []
    for task in preset.tasks:
        for entry in preset.task_entries(task):
            lr = lr_choice(preset, runs, task, trained_entry(preset, entry))
            if lr is not None:
                out += [Run(task, entry, lr, seed) for seed in seeds_of(preset, task, trained_entry(preset, entry))]
    return out


def test_run(preset: Preset, run: Run, runs: Path) -> dict:
    """The run's test eval (read back when done; its long lengths run again where the preset now reads them
    otherwise: `stale_lengths`); a quantized-cache or quantized-state entry evaluates its base's run."""
    folder = run.folder(runs)
    source = Run(run.task, trained_entry(preset, run.entry), run.lr, run.seed).folder(runs)
    done = read_json(folder / TEST)
    stale = None if done is None else stale_lengths(preset, run, done, read_json(source / SUMMARY)["seq_len"])
    if done is not None and not stale:
        return done
    overrides = run_overrides(preset, run)
    if not preset.entries[run.entry].trained:
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / RECORD, {**run.fields(), "overrides": overrides, "evaluates": str(source)})
    start, cpu = time.perf_counter(), time.process_time()
    result = {**(done or {}), **evaluate_run(preset, run, compose_config(overrides), source, stale)}
    seconds = {"test_wall_s": time.perf_counter() - start, "test_cpu_s": time.process_time() - cpu}
    record = read_json(folder / RECORD) or {}  # a trained run has one; a copied folder may not
    write_json(folder / RECORD, {**record, **{k: record.get(k, 0.0) + v for k, v in seconds.items()}})
    write_json(folder / TEST, result)
    return result


def stage_jobs(preset: Preset, runs: Path, stage: str) -> list[Run]:
    """The jobs of `stage` that can run now: the whole sweep; the grid extensions the finished sweeps ask for; the
    other seeds of headline entries whose sweep is done; the test eval of every best-lr run whose training is
    done."""
    if stage == "sweep":
        return sweep_runs(preset)
    if stage == "extend":
        return [r for r in extension_runs(preset, runs) if not (r.folder(runs) / SUMMARY).exists()]
    best = best_runs(preset, runs)
    if stage == "seeds":
        return [r for r in best if preset.entries[r.entry].trained and r.seed != preset.tasks[r.task].seeds[0]]
    source = lambda r: Run(r.task, trained_entry(preset, r.entry), r.lr, r.seed).folder(runs)
    return [r for r in best if (source(r) / SUMMARY).exists()]


def part_key(stage: str, index: int, run: Run) -> int:
    """The number that places a job in a part: its index in the (fixed) sweep; for later stages, whose job lists
    grow as sweeps finish, a stable hash of the job without its lr, so concurrent parts never share a job."""
    return index if stage == "sweep" else zlib.crc32(f"{run.task}/{run.entry}/{run.seed}".encode())


STAGES = dict(zip(STAGE_NAMES, (train_run, train_run, train_run, test_run)))


def run_stages(preset: Preset, runs: Path, part=(1, 1), only=None) -> dict[str, int]:
    """Run this part's jobs of each stage that can run now (see protocol.py), stage after stage; returns, per
    stage, how many of its jobs this call left (other parts', filtered out, or waiting for a sweep)."""
    left = {}
    for stage, action in STAGES.items():
        jobs = stage_jobs(preset, runs, stage)
        mine = [
            r for i, r in enumerate(jobs) if in_part(part_key(stage, i, r), part) and selected(only or {}, stage, r)
        ]
        with timed(runs, stage, len(mine)):
            for run in tqdm(mine, desc=stage, unit="run"):
                action(preset, run, runs)
        done = set(mine)  # the extend stage's list drops its finished runs (and may grow): count what is not done
        left[stage] = sum(r not in done for r in stage_jobs(preset, runs, stage))
    return left


def collect(preset: Preset, runs: Path, previous: dict | None = None) -> dict:
    """Everything the report needs from the run folders: each task's facts, each entry's layers, and every run's
    record, summary, test eval (None where not yet made) and training-loss curve (TensorBoard's (step, seconds,
    loss); empty where not yet made). `previous` (the quality.json this one replaces) fills
    in the runs whose folders are gone (`carry_over`)."""
    every = [*sweep_runs(preset), *extension_runs(preset, runs), *(best_runs(preset, runs) or [])]
    candidates = {(r.task, r.entry, r.lr, r.seed): r for r in every}
    records = {}
    for key, run in candidates.items():
        folder = run.folder(runs)
        records[key] = {
            **run.fields(),
            "folder": str(folder),
            "record": read_json(folder / RECORD),
            "summary": read_json(folder / SUMMARY),
            "test": read_json(folder / TEST),
            "train_curve": train_loss_curve(folder / "tb"),  # kept here so a carried-over run keeps its curve
            "model": model_section(folder / CONFIG),  # the model it trained, every default resolved: its recipe
        }
    records.update(carry_over(preset, records, previous))
    carried = {}  # (task, entry) -> the learning rates of its carried runs
    for r in records.values():
        if r.get("carried_over"):
            carried.setdefault((r["task"], r["entry"]), set()).add(r["lr"])
    tasks = {}
    code = lambda e: preset.entries[e].state_code  # a quantized-state entry's states are stored in that format
    for task, spec in preset.tasks.items():
        cfg = compose_config(run_overrides(preset, Run(task, "power", spec.lrs[0], spec.seeds[0])))
        configs = {e: compose_config(run_overrides(preset, Run(task, e, 1e-3, 0))) for e in preset.task_entries(task)}
        lengths = [s * cfg.data.seq_len for s in spec.test_scales]
        tasks[task] = {
            "data": spec.data,
            "seq_len": cfg.data.seq_len,
            "tokens_per_run": cfg.trainer.steps * cfg.data.batch_size * cfg.data.seq_len,
            "num_kv_pairs": getattr(cfg.data, "num_kv_pairs", None),
            "vocab_size": getattr(cfg.data, "vocab_size", None),
            "min_gap": getattr(cfg.data, "min_gap", None),
            "matched_window": matched_window(preset, task),
            "lrs": list(spec.lrs),
            "seeds": list(spec.seeds),
            "entries": list(preset.task_entries(task)),
            "entry_lrs": {
                e: sorted({*entry_lrs(preset, runs, task, e), *carried.get((task, e), ())})
                for e in configs
                if preset.entries[e].trained
            },
            "cache_bytes": {e: lm_cache_bytes(c, cfg.data.seq_len, code(e)) for e, c in configs.items()},
            "cache_bytes_by_length": {  # a frontier task's x axis at each test length (a KV cache grows with it)
                e: {str(L): lm_cache_bytes(c, L, code(e)) for L in lengths} for e, c in configs.items()
            }
            if task in preset.frontier_tasks
            else {},
        }
    entries = {
        name: {
            "group": e.group,
            "base": e.base,
            "change": e.change,
            "kv_cache_bits": e.kv_cache_bits,
            "state_format": e.state_format,
        }
        for name, e in preset.entries.items()
    }
    roles = {"headline": list(preset.headline), "ablations": list(preset.ablations), "frontier": list(preset.frontier)}
    roles["frontier_tasks"] = list(preset.frontier_tasks)
    return {"tasks": tasks, "entries": entries, "roles": roles, "runs": list(records.values()), "runs_dir": str(runs)}


# Layer kinds whose defaults did not change when runs began to keep their resolved model (2026-12-03, the recipe
# study: P lost RoPE, D, G and M took the long decay init): a record without one is carried only for these.
UNCHANGED_KINDS = {"A", "W"}


def carry_over(preset: Preset, records: dict, previous: dict | None) -> dict:
    """{(task, entry, lr, seed): record} of `previous`'s runs to keep: those of each (task, entry) with no finished
    run among `records` (its folders are gone, or it has not run here), each one only when its compare.json
    overrides compose to the config the preset's overrides for that run compose to today (the same config written
    another way, say a recipe's keys moved into its experiment file, is the same run) and its resolved model section
    (`model`) is the one they compose to today, so a run made with another recipe is never carried (a record from
    before runs kept their model section is carried only for layers of A and W, whose defaults have not changed
    since; an evaluation of a quantized cache or state is carried with its base's run). An entry's runs on a task
    are read whole from their folders or whole from `previous`, never mixed (its
    best learning rate is one sweep's); entries of one task may come from either.
    Marked `carried_over: true`; its folder, TensorBoard curve and checkpoints may be gone (summary.json keeps the
    eval curve). This keeps a committed quality.json's results when a later call runs other tasks on a machine
    without the earlier runs' folders."""
    found = {(r["task"], r["entry"]) for r in records.values() if r["summary"] is not None or r["test"] is not None}
    prior = {(r["task"], r["entry"], r["lr"], r["seed"]): r for r in (previous or {}).get("runs", [])}
    out = {}
    for key, old in prior.items():
        task, entry = key[0], key[1]
        if (task, entry) in found or task not in preset.tasks or entry not in preset.task_entries(task):
            continue
        made = (task, trained_entry(preset, entry), *key[2:])  # the run it trained, or (an evaluation) its base's
        if made in prior and made_today(preset, old, key) and made_today(preset, prior[made], made):
            out[key] = {**old, "carried_over": True}
    return out


def made_today(preset: Preset, old: dict, key: tuple) -> bool:
    """Whether the previous record `old` of run `key` (task, entry, lr, seed) is what the preset makes today: its
    compare.json overrides compose to the config the preset's overrides compose to, and, for a trained entry, the
    model it resolved to is today's (a record without one only for layers of UNCHANGED_KINDS). An evaluation (a
    quantized cache or state) trains no model: its base's record answers for that (`carry_over`)."""
    overrides = [o for o in (old["record"] or {}).get("overrides", []) if not o.startswith("trainer.peak_flops=")]
    recorded = compose_config(overrides)
    if recorded != compose_config(run_overrides(preset, Run(*key))):
        return False
    if not preset.entries[key[1]].trained:
        return True
    today = resolved_model(recorded)
    return old.get("model") == today or (old.get("model") is None and set(today["pattern"]) <= UNCHANGED_KINDS)
