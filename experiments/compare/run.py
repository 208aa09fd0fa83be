"""The comparison in one command: speed, memory and quality of softmax (A), sliding window (W), a window with the
power state's bytes (swa_matched), power retention (P) and the 3:1 hybrid (PPPA), then the report.

    python experiments/compare/run.py --preset cpu     # this 2-core machine, about an hour -> results/REPORT.md
    python experiments/compare/run.py --preset gpu     # one H100/H200, contexts to 64k, three seeds
    python experiments/compare/run.py --preset smoke   # seconds: the pipeline at toy sizes

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
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import jax  # noqa: E402

from models import matched_window  # noqa: E402
from presets import PRESETS  # noqa: E402
from quality import measure_quality  # noqa: E402
from report import write_report  # noqa: E402
from speed import measure_speed  # noqa: E402


def machine() -> dict:
    """What ran the comparison: backend, device kind, CPU count, JAX version, date."""
    return {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "devices": jax.device_count(),
            "cpus": os.cpu_count(), "platform": platform.platform(), "jax": jax.__version__,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}  # fmt: skip


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
    meta = {"preset": preset.name, "machine": machine(), "matched_window": window, "command": " ".join(sys.argv)}
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
