"""How long a preset takes on this machine, from what measured runs took: each task's mean seconds a training run
over the runs found under the given runs folders at that task's tokens (compare.json's wall or CPU seconds,
config.yaml's tokens), else a line `seconds = overhead + tokens / rate` fitted to all of them; the test stage's
seconds a job and the speed sweep's seconds (<runs>/timings.json); applied to the preset's job list.

    python -m experiments.compare.estimate --preset cpu --measured outputs/compare/cpu outputs/compare/smoke
    python -m experiments.compare.estimate --preset cpu   # a fresh clone: the committed quality.json's runs

CPU seconds (all threads) do not depend on what else the machine runs; wall seconds on 2 idle cores are at most
the CPU seconds (XLA's CPU programs use both cores only in part), so `--seconds cpu` gives an upper bound there.
A task under the convergence rule (trainer.early_stop) trains each run between its earliest possible stop and its
cap (trainer.steps); an lr grid extends at most `lr_extensions` runs an entry: the total is given both ways, at
the caps with every extension (an upper bound) and at the earliest stops without extensions (a lower bound).
"""

import argparse
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from experiments.compare.models import compose_config
from experiments.compare.presets import PRESETS, Preset
from experiments.compare.protocol import Run, seeds_of, sweep_runs
from experiments.compare.quality import run_overrides
from experiments.compare.runs import CONFIG, RECORD, TIMINGS, read_json


def measured_runs(folders: list[Path], key: str) -> list[tuple[str, int, float]]:
    """(task, tokens trained, seconds) of every finished training run under `folders`."""
    out = []
    for folder in folders:
        for record_path in folder.rglob(RECORD):
            record = read_json(record_path)
            if key not in record or not (record_path.parent / CONFIG).exists():
                continue
            cfg = OmegaConf.load(record_path.parent / CONFIG)
            tokens = cfg.trainer.steps * cfg.data.batch_size * cfg.data.seq_len
            out.append((record.get("task"), tokens, float(record[key])))
    return out


def committed_runs(quality_json: Path, key: str) -> list[tuple[str, int, float]]:
    """(task, tokens trained, seconds) of every run recorded in a comparison's quality.json (the committed
    results/compare/<preset>/quality.json: each run's overrides and seconds), for a clone without run folders."""
    out = []
    for run in (read_json(quality_json) or {}).get("runs", []):
        record = run.get("record") or {}
        if key in record and record.get("overrides"):
            cfg = compose_config(record["overrides"])
            out.append((record["task"], cfg.trainer.steps * cfg.data.batch_size * cfg.data.seq_len, float(record[key])))
    return out


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(overhead seconds, seconds per token) of the least-squares line through the points (at least two token
    counts; with one, the overhead is 0)."""
    tokens, seconds = np.array(points, dtype=float).T
    if len(set(tokens)) < 2:
        return 0.0, float(np.sum(seconds) / np.sum(tokens))
    per_token, overhead = np.polyfit(tokens, seconds, 1)
    return float(max(overhead, 0.0)), float(per_token)


def trained_jobs(preset: Preset) -> list[Run]:
    """Every training run of the preset: the sweep and the headline's other seeds (at one lr: the same tokens)."""
    seeds = [
        Run(t, e, preset.tasks[t].lrs[0], s)
        for t in preset.tasks
        for e in preset.task_entries(t)
        if preset.entries[e].trained
        for s in seeds_of(preset, t, e)[1:]
    ]
    return [*sweep_runs(preset), *seeds]


def earliest_steps(cfg) -> int:
    """The first step at which the convergence rule can stop a run of `cfg` (its cap when the rule is off): the
    eval `patience` evals after the first, and none before min_step."""
    rule, every, cap = cfg.trainer.early_stop, cfg.trainer.eval_every, cfg.trainer.steps
    if not rule.patience:
        return cap
    return min(cap, max((rule.patience + 1) * every, -(-rule.min_step // every) * every))


def extension_job_count(preset: Preset) -> int:
    """The most runs the lr grids' extensions can add: `lr_extensions` per trained entry of a task with two or
    more learning rates."""
    return sum(
        spec.lr_extensions * sum(preset.entries[e].trained for e in preset.task_entries(task))
        for task, spec in preset.tasks.items()
        if len(spec.lrs) > 1
    )


def eval_job_count(preset: Preset) -> int:
    """How many test evals the preset makes: every reported seed of every entry at its best lr."""
    count = 0
    for t in preset.tasks:
        for e in preset.task_entries(t):
            base = e if preset.entries[e].trained else preset.entries[e].base
            count += len(seeds_of(preset, t, base))
    return count


def estimate(preset: Preset, folders: list[Path], key: str = "cpu_s", committed: Path | None = None) -> dict:
    """The preset's estimated seconds per stage from the runs measured under `folders`, else (none there) from the
    runs recorded in `committed` (a quality.json). ValueError when neither holds a finished run."""
    measured = measured_runs(folders, key) or (committed_runs(committed, key) if committed else [])
    if not measured:
        where = ", ".join(map(str, [*folders, *([committed] if committed else [])])) or "nowhere"
        raise ValueError(f"no finished training run with {key} under {where}: nothing to time the preset from")
    overhead, per_token = fit([(n, sec) for _, n, sec in measured])
    tokens, earliest = {}, {}
    for task in preset.tasks:
        cfg = compose_config(run_overrides(preset, Run(task, preset.headline[0], 1e-3, 0)))
        tokens[task] = cfg.trainer.steps * cfg.data.batch_size * cfg.data.seq_len
        earliest[task] = earliest_steps(cfg) * cfg.data.batch_size * cfg.data.seq_len
    # A task's measured runs at this preset's tokens give its seconds a run; other tasks take the fitted line.
    per_run = {}
    for task, n in tokens.items():
        same = [sec for t, m, sec in measured if t == task and m == n]
        per_run[task] = sum(same) / len(same) if same else overhead + per_token * n
    per_run_earliest = {t: min(per_run[t], overhead + per_token * n) for t, n in earliest.items()}
    jobs = trained_jobs(preset)
    train_s = sum(per_run[r.task] for r in jobs)
    extension_jobs = extension_job_count(preset)
    extend_s = sum(  # each extension at its task's cap
        spec.lr_extensions * per_run[t] * sum(preset.entries[e].trained for e in preset.task_entries(t))
        for t, spec in preset.tasks.items()
        if len(spec.lrs) > 1
    )
    timings = [read_json(f / TIMINGS) or {} for f in folders]
    test = [t["test"] for t in timings if t.get("test", {}).get("jobs")]
    test_per_job = sum(t[key] for t in test) / sum(t["jobs"] for t in test) if test else None
    speed = [t["speed"][key] for t in timings if t.get("speed", {}).get("jobs")]
    out = {
        "overhead_s": overhead,
        "tokens_per_s": 1 / per_token,
        "trained_runs": len(jobs),
        "tokens_per_run": tokens,
        "seconds_per_run": per_run,
        "train_s": train_s,
        "earliest_tokens_per_run": earliest,
        "train_s_earliest": sum(per_run_earliest[r.task] for r in jobs),
        "extension_runs_max": extension_jobs,
        "extend_s_max": extend_s,
        "test_jobs": eval_job_count(preset),
        "test_s": None if test_per_job is None else test_per_job * eval_job_count(preset),
        "speed_s": max(speed) if speed else None,
    }
    fixed = sum(v for k, v in out.items() if k in ("test_s", "speed_s") and v is not None)
    out["total_s"] = out["train_s"] + out["extend_s_max"] + fixed  # at the caps, every extension
    out["total_s_earliest"] = out["train_s_earliest"] + fixed  # every run at its earliest stop, no extension
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=tuple(PRESETS), default="cpu")
    parser.add_argument(
        "--measured", nargs="+", type=Path, default=[], help="runs folders with finished runs (default: <runs> of it)"
    )
    parser.add_argument(
        "--committed",
        type=Path,
        help="a quality.json to time from when no run folder has a finished run "
        "(default: results/compare/<preset>/quality.json)",
    )
    parser.add_argument("--seconds", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args(argv)
    folders = args.measured or [p for p in [Path(f"outputs/compare/{args.preset}")] if p.exists()]
    committed = args.committed or Path(f"results/compare/{args.preset}/quality.json")
    try:
        result = estimate(PRESETS[args.preset], folders, f"{args.seconds}_s", committed)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    for key, value in result.items():
        print(f"{key}: {value:,.1f}" if isinstance(value, float) else f"{key}: {value}")
    low, high = result["total_s_earliest"] / 60, result["total_s"] / 60
    print(
        f"total: {low:.1f} to {high:.1f} minutes ({args.seconds} seconds; from every run at its earliest stop "
        "without lr extensions to every run at its cap with every extension; missing stages not counted)"
    )


if __name__ == "__main__":
    main()
