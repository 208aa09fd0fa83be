"""How long a preset, or one named part of it, takes on this machine, from what measured jobs took: each job at the
mean seconds of the measured jobs of its (task, entry) at its tokens; a training run of an entry not measured on its
task at the task's reference entry's seconds (the headline's first) times the entry's ratio to it on the tasks where
both ran; else at its task's mean, else at a line `seconds = overhead + tokens / rate` fitted to every measured run
(a test eval: its task's mean, else the test stage's); the speed sweep at its measured seconds a model
where speed.json must measure it again; a call's own seconds (collecting the runs, writing the report).

    python -m experiments.compare.estimate --preset cpu                      # the whole preset, one call
    python -m experiments.compare.estimate --preset cpu --only task=mqar     # a named part: what that call runs
    python -m experiments.compare.estimate --preset cpu --part 1/2           # every other job of each stage
    python -m experiments.compare.estimate --preset cpu --measured outputs/compare/cpu outputs/compare/smoke

Measured jobs come from the runs folders' compare.json files (training and test-eval seconds) and timings.json
(the speed sweep's seconds; a call's own, its "report" stage); a fresh clone has none and reads the committed
results/compare/<preset>/quality.json (every run's record) and timings.json, which run.py writes from its runs
folder. Wall seconds (the default) are what a call takes where its jobs ran; CPU seconds (all threads) are no
steadier: XLA's CPU threads spin while they wait, so a run sharing its cores with other jobs counts more CPU
seconds than the same run on idle cores (1.1-1.7x a task in the cpu preset's records; experiments/PERF_LOG.md). A
record's seconds are as clean as the machine was when it ran: the cpu preset's say where they come from.

The expected total counts the lr grids' extensions the measured or committed sweeps asked for (training is
deterministic: the same sweep asks for the same extensions) and each run at its measured length under the
convergence rule; the range runs from every run at its earliest possible stop without extensions to every possible
extension.
"""

import argparse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from experiments.compare.models import compose_config
from experiments.compare.presets import PRESETS, Preset
from experiments.compare.protocol import (
    Run,
    check_only,
    in_part,
    parse_only,
    parse_part,
    seeds_of,
    selected,
    sweep_runs,
)
from experiments.compare.quality import part_key, run_overrides
from experiments.compare.runs import CONFIG, RECORD, TIMINGS, read_json
from experiments.compare.speed import unmeasured

KINDS = ("wall", "cpu")


@dataclass(frozen=True)
class Measured:
    """One measured job: a training run (`train_s`, its `tokens`), its test eval (`test_s`), or both."""

    task: str
    entry: str
    lr: float
    tokens: int | None
    train_s: float | None
    test_s: float | None


def tokens_of(cfg) -> int:
    """Tokens a run of `cfg` trains at its cap: steps x batch x sequence length."""
    return cfg.trainer.steps * cfg.data.batch_size * cfg.data.seq_len


def measured_runs(folders: list[Path], kind: str) -> list[Measured]:
    """Every measured job under `folders`: each compare.json with `<kind>_s` (a finished training run, its tokens
    from config.yaml) or `test_<kind>_s` (a timed test eval)."""
    out = []
    for folder in folders:
        for record_path in folder.rglob(RECORD):
            config = lambda path=record_path.parent / CONFIG: tokens_of(OmegaConf.load(path))
            out += _measured(read_json(record_path), kind, config)
    return out


def committed_runs(quality_json: Path, kind: str) -> list[Measured]:
    """Every measured job recorded in a comparison's quality.json (each run's record: overrides and seconds), for
    a clone without run folders."""
    out = []
    for run in (read_json(quality_json) or {}).get("runs", []):
        record = run.get("record") or {}
        if record.get("overrides"):
            out += _measured(record, kind, lambda r=record: tokens_of(compose_config(r["overrides"])))
    return out


def _measured(record: dict, kind: str, tokens) -> list[Measured]:
    """The record's measured job ([] when it holds no seconds of `kind`); `tokens()` reads its config when needed."""
    train_s, test_s = record.get(f"{kind}_s"), record.get(f"test_{kind}_s")
    if train_s is None and test_s is None:
        return []
    run_tokens = tokens() if train_s is not None else None
    return [Measured(record["task"], record["entry"], record["lr"], run_tokens, train_s, test_s)]


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(overhead seconds, seconds per token) of the least-squares line through the points (at least two token
    counts; with one, the overhead is 0)."""
    tokens, seconds = np.array(points, dtype=float).T
    if len(set(tokens)) < 2:
        return 0.0, float(np.sum(seconds) / np.sum(tokens))
    per_token, overhead = np.polyfit(tokens, seconds, 1)
    return float(max(overhead, 0.0)), float(per_token)


def earliest_steps(cfg) -> int:
    """The first step at which the convergence rule can stop a run of `cfg` (its cap when the rule is off): the
    eval `patience` evals after the first, and none before min_step."""
    rule, every, cap = cfg.trainer.early_stop, cfg.trainer.eval_every, cfg.trainer.steps
    if not rule.patience:
        return cap
    return min(cap, max((rule.patience + 1) * every, -(-rule.min_step // every) * every))


def other_seed_runs(preset: Preset) -> list[Run]:
    """The seeds stage's runs: every trained entry's reported seeds after the first (at the grid's first lr; the
    chosen one is not known before the sweep and does not change the tokens)."""
    return [
        Run(t, e, preset.tasks[t].lrs[0], s)
        for t in preset.tasks
        for e in preset.task_entries(t)
        if preset.entries[e].trained
        for s in seeds_of(preset, t, e)[1:]
    ]


def eval_runs(preset: Preset) -> list[Run]:
    """The test stage's jobs: every reported seed of every entry (a quantized entry: its base's seeds)."""
    out = []
    for t in preset.tasks:
        for e in preset.task_entries(t):
            base = e if preset.entries[e].trained else preset.entries[e].base
            out += [Run(t, e, preset.tasks[t].lrs[0], s) for s in seeds_of(preset, t, base)]
    return out


def extension_slots(preset: Preset) -> list[Run]:
    """Every run an lr grid's extensions could add (`lr_extensions` per trained entry of a task with two or more
    learning rates; the lr is a placeholder)."""
    return [
        Run(task, e, 0.0, spec.seeds[0])
        for task, spec in preset.tasks.items()
        if len(spec.lrs) > 1
        for e in preset.task_entries(task)
        if preset.entries[e].trained
        for _ in range(spec.lr_extensions)
    ]


def in_selection(stage: str, index: int, run: Run, part=(1, 1), only=None) -> bool:
    """Whether run.py's call with `--part`/`--only` runs this job: its rule (quality.run_stages), applied here."""
    return selected(only or {}, stage, run) and in_part(part_key(stage, index, run), part)


def selected_jobs(preset: Preset, part=(1, 1), only=None) -> dict[str, list[Run]]:
    """{stage: the jobs a call with `--part`/`--only` runs}: the sweep, the other seeds and the test evals."""
    stages = {"sweep": sweep_runs(preset), "seeds": other_seed_runs(preset), "test": eval_runs(preset)}
    return {s: [r for i, r in enumerate(jobs) if in_selection(s, i, r, part, only)] for s, jobs in stages.items()}


def mean_by(jobs: list[Measured], field: str, *keys: str) -> dict:
    """{(the job's `keys` fields): the mean of its `field`} over the jobs where `field` was measured."""
    groups = defaultdict(list)
    for j in jobs:
        if (value := getattr(j, field)) is not None:
            groups[tuple(getattr(j, k) for k in keys)].append(value)
    return {k: sum(v) / len(v) for k, v in groups.items()}


def read_timings(folders: list[Path], committed: Path | None) -> dict:
    """The stage and call seconds of the runs folders' timings.json, summed; else the committed timings.json."""
    found = [t for f in folders if (t := read_json(f / TIMINGS))]
    if not found and committed is not None:
        found = [t for t in [read_json(committed)] if t]
    out: dict[str, dict] = {}
    for timings in found:
        for stage, value in timings.items():
            old = out.setdefault(stage, {"jobs": 0, "wall_s": 0.0, "cpu_s": 0.0})
            out[stage] = {k: old[k] + value[k] for k in old}
    return out


def speed_models(preset: Preset, speed_json: Path | None) -> list[str]:
    """The speed sweep's models a call measures: those speed.json lacks or measured with another recipe."""
    if preset.speed is None:
        return []
    return unmeasured(preset, (read_json(speed_json) or {}).get("results") if speed_json else None)


def estimate(
    preset: Preset,
    folders: list[Path],
    key: str = "wall_s",
    committed: Path | None = None,
    part=(1, 1),
    only=None,
    data: Path | None = None,
) -> dict:
    """Seconds of a call of run.py with `--part`/`--only`, per stage, from the jobs measured under `folders`, else
    (none there) those recorded in `committed` (a quality.json); `data` holds the committed timings.json and
    speed.json. ValueError when neither holds a finished training run.

    Returns:
        The counts of jobs, the seconds per stage and the totals (`total_s` expected, `total_s_low` and
        `total_s_high` its range); a stage no measurement times is None and left out of the totals.
    """
    kind = key.removesuffix("_s")
    if kind not in KINDS:
        raise ValueError(f"key must be one of {[k + '_s' for k in KINDS]}, got {key!r}")
    measured, recorded = measured_runs(folders, kind), committed_runs(committed, kind) if committed else []
    if not any(m.train_s is not None for m in measured):
        measured = recorded
    trained = [m for m in measured if m.train_s is not None]
    if not trained:
        where = ", ".join(map(str, [*folders, *([committed] if committed else [])])) or "nowhere"
        raise ValueError(f"no finished training run with {key} under {where}: nothing to time the preset from")
    overhead, per_token = fit([(m.tokens, m.train_s) for m in trained])
    train_pair, train_task = (mean_by(trained, "train_s", *k, "tokens") for k in (("task", "entry"), ("task",)))
    test_pair, test_task = mean_by(measured, "test_s", "task", "entry"), mean_by(measured, "test_s", "task")
    timings = read_timings(folders, data / TIMINGS if data else None)

    cfgs = {t: compose_config(run_overrides(preset, Run(t, preset.headline[0], 1e-3, 0))) for t in preset.tasks}
    tokens = {t: tokens_of(c) for t, c in cfgs.items()}
    earliest = {t: earliest_steps(c) * c.data.batch_size * c.data.seq_len for t, c in cfgs.items()}
    line = lambda n: overhead + per_token * n

    reference = preset.headline[0]  # an entry not measured on a task: its ratio to this one where both ran

    def train_seconds(r: Run) -> float:  # see the module's docstring for the order
        n = tokens[r.task]
        if (r.task, r.entry, n) in train_pair:
            return train_pair[(r.task, r.entry, n)]
        ratios = [
            v / train_pair[(t, reference, m)]
            for (t, e, m), v in train_pair.items()
            if e == r.entry and (t, reference, m) in train_pair
        ]
        if ratios and (r.task, reference, n) in train_pair:
            return train_pair[(r.task, reference, n)] * sum(ratios) / len(ratios)
        return train_task.get((r.task, n), line(n))

    test = timings.get("test", {})
    test_fallback = test[key] / test["jobs"] if test.get("jobs") else None

    def test_seconds(r: Run) -> float | None:
        return test_pair.get((r.task, r.entry), test_task.get((r.task,), test_fallback))

    jobs = selected_jobs(preset, part, only)
    training = [*jobs["sweep"], *jobs["seeds"]]
    grid = {t: set(spec.lrs) for t, spec in preset.tasks.items()}
    # The extensions the sweeps asked for: the runs here and the committed ones (the same sweeps ask the same).
    ran = [m for m in [*trained, *recorded] if m.train_s is not None and m.task in grid]  # not the evals alone
    extended = {(m.task, m.entry, m.lr) for m in ran if m.lr not in grid[m.task]}
    extensions = [
        r
        for r in (Run(t, e, lr, preset.tasks[t].seeds[0]) for t, e, lr in sorted(extended))
        if r.entry in preset.task_entries(r.task) and in_selection("extend", 0, r, part, only)
    ]
    slots = [r for r in extension_slots(preset) if in_selection("extend", 0, r, part, only)]
    tests = [test_seconds(r) for r in jobs["test"]]

    speed = timings.get("speed", {})
    to_measure = speed_models(preset, data / "speed.json" if data else None) if part[0] == 1 and not only else []
    speed_s = 0.0 if not to_measure else (speed[key] / speed["jobs"] * len(to_measure) if speed.get("jobs") else None)
    report = timings.get("report", {})  # a call's own seconds: collecting the runs and writing the report
    call_s = report[key] / report["jobs"] if report.get("jobs") else None

    out = {
        "seconds": kind,
        "overhead_s": overhead,
        "tokens_per_s": 1 / per_token,
        "trained_runs": len(training),
        "tokens_per_run": tokens,
        "train_s": sum(train_seconds(r) for r in training),
        "earliest_tokens_per_run": earliest,
        "train_s_earliest": sum(min(train_seconds(r), line(earliest[r.task])) for r in training),
        "extension_runs": len(extensions),
        "extend_s": sum(train_seconds(r) for r in extensions),
        "extension_runs_max": len(slots),
        "extend_s_max": sum(train_seconds(r) for r in slots),
        "test_jobs": len(jobs["test"]),
        "test_s": None if None in tests else sum(tests),
        "speed_models": to_measure,
        "speed_s": speed_s,
        "call_s": call_s,
    }
    fixed = sum(v for k, v in out.items() if k in ("test_s", "speed_s", "call_s") and v is not None)
    out["total_s"] = out["train_s"] + out["extend_s"] + fixed
    out["total_s_low"] = out["train_s_earliest"] + fixed
    out["total_s_high"] = out["train_s"] + out["extend_s_max"] + fixed
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=tuple(PRESETS), default="cpu")
    parser.add_argument(
        "--measured", nargs="+", type=Path, default=[], help="runs folders with finished runs (default: <runs> of it)"
    )
    parser.add_argument(
        "--data",
        type=Path,
        help="the comparison's data folder: quality.json to time from when no run folder has a finished run, "
        "timings.json, speed.json (default: results/compare/<preset>)",
    )
    parser.add_argument("--seconds", choices=KINDS, default="wall")
    parser.add_argument("--part", default="1/1", help="k/n, as run.py takes it")
    parser.add_argument("--only", action="append", default=[], help="filters, as run.py takes them")
    args = parser.parse_args(argv)
    folders = args.measured or [p for p in [Path(f"outputs/compare/{args.preset}")] if p.exists()]
    data = args.data or Path(f"results/compare/{args.preset}")
    try:
        part, only = parse_part(args.part), parse_only(args.only)
        check_only(PRESETS[args.preset], only)
        result = estimate(PRESETS[args.preset], folders, f"{args.seconds}_s", data / "quality.json", part, only, data)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    for key, value in result.items():
        print(f"{key}: {value:,.1f}" if isinstance(value, float) else f"{key}: {value}")
    missing = [k for k in ("test_s", "speed_s", "call_s") if result[k] is None]
    print(
        f"total: {result['total_s'] / 60:.1f} minutes expected ({args.seconds} seconds; "
        f"{result['total_s_low'] / 60:.1f} with every run at its earliest stop and no lr extension, "
        f"{result['total_s_high'] / 60:.1f} with every possible extension)"
        + (f"; not counted, unmeasured: {', '.join(missing)}" if missing else "")
    )


if __name__ == "__main__":
    main()
