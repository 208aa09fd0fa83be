"""The comparison in one command: speed, memory and quality of softmax (A), sliding window (W), a window with the
power state's bytes (swa_matched), power retention (P) and the 3:1 hybrid (PPPA), then the report.

    python -m experiments.compare.run --preset cpu     # this 2-core machine, about an hour -> results/REPORT.md
    python -m experiments.compare.run --preset gpu     # one H100/H200, contexts to 64k, three seeds
    python -m experiments.compare.run --preset smoke   # seconds: the pipeline at toy sizes

Writes <data>/speed.json and <data>/quality.json (data: results/compare/<preset>), training runs under
<runs> (outputs/compare/<preset>: one TensorBoard folder for all of them), then experiments/report.py's
Markdown and PNGs. Finished training runs are reused, so an interrupted comparison resumes; --skip-speed or
--skip-quality keeps the other half's JSON as it is.
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
from experiments.compare.quality import measure_quality
from experiments.compare.speed import measure_speed
from experiments.report import write_report


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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=tuple(PRESETS), default="cpu")
    parser.add_argument("--data", help="folder for speed.json, quality.json and the plots (results/compare/<preset>)")
    parser.add_argument("--runs", help="folder for the training runs (outputs/compare/<preset>)")
    parser.add_argument("--report", help="the Markdown report (results/REPORT.md for cpu, else <data>/REPORT.md)")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    data = Path(args.data or f"results/compare/{preset.name}")
    runs = Path(args.runs or f"outputs/compare/{preset.name}")
    report = Path(args.report or ("results/REPORT.md" if preset.name == "cpu" else data / "REPORT.md"))
    data.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.WARNING)  # the console: warnings; each run's train.log: INFO (quality.py)
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger().handlers[0].setLevel(logging.WARNING)
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every save at INFO

    window = matched_window(preset)
    command = shlex.join(["python", "-m", "experiments.compare.run", *sys.argv[1:]])
    meta = {"preset": preset.name, "machine": machine(), "matched_window": window, "command": command}
    if not args.skip_speed:
        speed = measure_speed(preset, window)
        (data / "speed.json").write_text(json.dumps({**meta, "results": speed}, indent=2))
    if not args.skip_quality:
        quality = measure_quality(preset, window, runs)
        (data / "quality.json").write_text(json.dumps({**meta, "runs": str(runs), "results": quality}, indent=2))
    write_report(data, report)
    print(f"wrote {report}; TensorBoard for the training runs: tensorboard --logdir {runs}")


if __name__ == "__main__":
    main()
