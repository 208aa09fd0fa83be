"""Print one table for a sweep folder: every run's summary.json (written by train.py) as a row, then the
TensorBoard command for the whole sweep.

    python experiments/summarize_sweep.py multirun/2026-01-01_12-00-00

Columns: final loss (eval loss at the training length), accuracy on the labelled positions at the training
length T and at the longest eval length, median training tokens/s, and decode-cache bytes per sequence at
trainer.cache_len tokens (65536 by default).
"""

import argparse
import glob
import json
import os


def human_bytes(n: float) -> str:
    """Bytes in B, KiB, MiB or GiB with three significant digits."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def load(sweep_dir: str) -> list[dict]:
    """The summaries of every run under `sweep_dir`, in the order of their folders."""
    paths = sorted(glob.glob(os.path.join(sweep_dir, "**", "summary.json"), recursive=True))
    return [json.load(open(p)) for p in paths]


def table(summaries: list[dict]) -> str:
    """The sweep's table, one row per run."""
    lengths = sorted({int(L) for s in summaries for L in s["eval"]})
    T, long = lengths[0], lengths[-1]
    cache_len = lambda s: max(int(L) for L in s["cache_bytes"])  # trainer.cache_len, the largest listed
    header = ["model", "pattern", "params", "final loss", f"acc@{T}", f"acc@{long}", "tokens/s",
              f"cache@{cache_len(summaries[0]) // 1024}k"]  # fmt: skip
    rows = [header]
    for s in summaries:
        acc = lambda L: f"{s['eval'][str(L)]['accuracy']:.3f}" if str(L) in s["eval"] else "-"
        rows.append([s["model"], s["pattern"] * (s["n_layers"] // len(s["pattern"])), f"{s['params']:,}",
                     f"{s['final_loss']:.3f}", acc(T), acc(long), f"{s['tokens_per_s']:,.0f}",
                     human_bytes(s["cache_bytes"][str(cache_len(s))])])  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
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
