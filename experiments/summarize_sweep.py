"""Print one table for a sweep folder: every run's summary.json (written by train.py) as a row, then the
TensorBoard command for the whole sweep.

    python -m experiments.summarize_sweep multirun/2026-01-01_12-00-00

Columns: the layers' mixers (the pattern repeated over the layers), final loss (eval loss at the training
length), accuracy on the labelled positions at the training length T and at the longest eval length, median
training tokens/s, and decode-cache bytes per sequence at trainer.cache_len tokens (65536 by default).
"""

import argparse
import glob
import json
import os
from pathlib import Path

from experiments.formatting import human_bytes, tokens


def load(sweep_dir: str) -> list[dict]:
    """The summaries of every run under `sweep_dir`, in the order of their folders."""
    paths = sorted(glob.glob(os.path.join(sweep_dir, "**", "summary.json"), recursive=True))
    return [json.loads(Path(p).read_text()) for p in paths]


def cache_len(summary: dict) -> int:
    """trainer.cache_len of the run: the largest context its cache bytes are listed at."""
    return max(int(L) for L in summary["cache_bytes"])


def accuracy(summary: dict, length: int) -> str:
    """The run's eval accuracy at `length`, or "-" where it was not evaluated there."""
    return f"{summary['eval'][str(length)]['accuracy']:.3f}" if str(length) in summary["eval"] else "-"


def table(summaries: list[dict]) -> str:
    """The sweep's table, one row per run."""
    lengths = sorted({int(L) for s in summaries for L in s["eval"]})
    T, long = lengths[0], lengths[-1]
    header = ["model", "layers", "params", "final loss", f"acc@{T}", f"acc@{long}", "tokens/s"]
    rows = [[*header, f"cache@{tokens(cache_len(summaries[0]))}"]]
    for s in summaries:
        rows.append(
            [
                s["model"],
                s["layer_kinds"],
                f"{s['params']:,}",
                f"{s['final_loss']:.3f}",
                accuracy(s, T),
                accuracy(s, long),
                "-" if s["tokens_per_s"] is None else f"{s['tokens_per_s']:,.0f}",
                human_bytes(s["cache_bytes"][str(cache_len(s))]),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", help="a Hydra sweep folder (hydra.sweep.dir)")
    args = parser.parse_args()
    summaries = load(args.sweep_dir)
    if not summaries:
        raise SystemExit(f"no summary.json under {args.sweep_dir!r}: did the runs finish?")
    print(table(summaries))
    print(f"\nTensorBoard for the sweep: tensorboard --logdir {args.sweep_dir}")


if __name__ == "__main__":
    main()
