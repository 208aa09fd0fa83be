"""The comparison in one command: speed, memory and quality of softmax (A), sliding window (W), the window with the
power state's bytes (swa_matched), power retention (P) and hybrids, each at its best of several learning rates
and over seeds (experiments/compare/protocol.py), with ablations and the recall-memory frontier; then the report.

    python -m experiments.compare.run --preset cpu                # this 2-core machine -> results/REPORT.md
    python -m experiments.compare.run --preset cpu --part 2/4     # a quarter of each stage's jobs (resumable)
    for k in 1 2 3; do python -m experiments.compare.run --preset cpu --part $k/3; done  # parts one after another,
    python -m experiments.compare.run --preset cpu                # then the seeds and tests the sweeps unlocked
    python -m experiments.compare.run --preset cpu --only task=mqar --skip-speed
    python -m experiments.compare.run --preset gpu_small          # one H200 in one call (under 10 minutes)
    python -m experiments.compare.run --preset gpu                # the full comparison on one H100/H200
    python -m experiments.compare.run --preset smoke              # seconds: the pipeline at toy sizes

Writes <data>/speed.json and <data>/quality.json (data: results/compare/<preset>), training runs under <runs>
(outputs/compare/<preset>: one TensorBoard folder for all), then experiments/compare/report.py's Markdown and
PNGs. Every finished run and test eval is reused, so the command resumes, and parts may run one after another or
side by side: run them until no job is left, then once more (or --report-only) for the whole report.
"""

import argparse
import datetime
import json
import logging
import os
import platform
import shlex
import sys
from pathlib import Path

import jax

from experiments.compare.models import matched_window
from experiments.compare.presets import PRESETS
from experiments.compare.protocol import check_only, parse_only, parse_part, sweep_runs
from experiments.compare.quality import collect, run_stages
from experiments.compare.report import write_report
from experiments.compare.runs import SUMMARY, TIMINGS, read_json, timed, write_json
from experiments.compare.speed import measure_speed, speed_recipes, unmeasured


def machine() -> dict:
    """What ran the comparison: backend, device kind, CPU count, JAX version, date."""
    return {
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "devices": jax.device_count(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "jax": jax.__version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def any_finished_run(preset, runs: Path) -> bool:
    """Whether any of the preset's sweep runs has finished under `runs` (its summary.json is there)."""
    return any((run.folder(runs) / SUMMARY).exists() for run in sweep_runs(preset))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=tuple(PRESETS), default="cpu")
    parser.add_argument("--data", help="folder for speed.json, quality.json and the plots (results/compare/<preset>)")
    parser.add_argument("--runs", help="folder for the training runs (outputs/compare/<preset>)")
    parser.add_argument(
        "--report", help="the Markdown report (results/REPORT.md for cpu without --data, else <data>/REPORT.md)"
    )
    parser.add_argument("--part", default="1/1", help="k/n: this call runs every n-th job of each stage")
    parser.add_argument("--only", action="append", default=[], help="filter: task=..., entry=..., stage=..., seed=...")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="collect the finished runs and write the report")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    preset, part, only = PRESETS[args.preset], parse_part(args.part), parse_only(args.only)
    check_only(preset, only)
    data = Path(args.data or f"results/compare/{preset.name}")
    runs = Path(args.runs or f"outputs/compare/{preset.name}")
    default_report = "results/REPORT.md" if preset.name == "cpu" and not args.data else data / "REPORT.md"
    report = Path(args.report or default_report)
    if args.report_only and not args.skip_quality and not any_finished_run(preset, runs):
        raise SystemExit(
            f"error: --report-only found no finished run under {runs}: it would overwrite {data / 'quality.json'} "
            f"and {report} with an empty report. Run the comparison first (or pass --runs FOLDER)."
        )
    data.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.WARNING)  # the console: warnings; each run's train.log: INFO (quality.py)
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger().handlers[0].setLevel(logging.WARNING)
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every save at INFO

    command = shlex.join(["python", "-m", "experiments.compare.run", *(argv if argv is not None else sys.argv[1:])])
    meta = {"preset": preset.name, "machine": machine(), "command": command}
    run_speed = preset.speed and not (args.skip_speed or args.report_only) and part[0] == 1 and not only
    if run_speed:
        done = (read_json(data / "speed.json") or {}).get("results")
        speed_meta = {**meta, "matched_window": matched_window(preset)}
        save = lambda results: write_json(data / "speed.json", {**speed_meta, "results": results})
        with timed(runs, "speed", len(unmeasured(preset, done))):
            measure_speed(preset, done, on_model=save)  # saved after each model measured; none measured: untouched
    if not (args.skip_quality or args.report_only):
        left = run_stages(preset, runs, part, only)
        print("jobs left to other parts, filtered out or waiting for sweeps:", json.dumps(left))
    # Collecting and the report are timed as the stage "report", so estimate.py can count a call's own seconds.
    with timed(runs, "report", 1):
        if not args.skip_quality:
            previous = read_json(data / "quality.json")  # its tasks without run folders here are carried over
            write_json(data / "quality.json", {**meta, **collect(preset, runs, previous)})
        write_report(data, report, speed_recipes=speed_recipes(preset))
    write_json(data / TIMINGS, read_json(runs / TIMINGS))  # for estimate.py in a clone without the runs
    print(f"wrote {report}; TensorBoard for the training runs: tensorboard --logdir {runs}")


if __name__ == "__main__":
    main()
