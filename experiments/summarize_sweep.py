"""Print one table for a sweep folder: every run's summary.json (written by train.py) as a row, then the
TensorBoard command for the whole sweep.

    python -m experiments.summarize_sweep multirun/2026-01-01_12-00-00 [--csv sweep.csv] [--json sweep.json]

Rows in job order (job 2 before job 10). Columns: `job`; the swept keys, each key whose command-line value
(the run's .hydra/overrides.yaml) differs between runs, named by its last part (`min_gap`, `seq_len`, `lr`);
`model` and `layers` (the pattern repeated over the layers); `params`; `T` (the training length), `steps`;
`loss@T` (eval loss at T); `acc@T`, `acc@4T`, ...: accuracy on the labelled positions at each eval length as a
multiple of the row's own T ("-" where the run was not evaluated there); `tokens/s` (median training
throughput); `cache@64k`: decode-cache bytes per sequence at trainer.cache_len tokens (65536 by default).

--csv and --json also write the table's values unformatted (pandas' to_csv, and to_json as a list of records):
the swept keys by their full names (`data.seq_len`), the command line's text of each (empty or null where a run
did not set it), numbers as numbers, empty or null where a run was not evaluated or measured, and
`cache_bytes@65536` in bytes.
"""

import argparse
import json
import re
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from experiments.formatting import human_bytes, tokens

SUMMARY, OVERRIDES = "summary.json", Path(".hydra") / "overrides.yaml"


def natural_key(path: Path) -> list:
    """Sort key of a run folder: its path's digit runs as numbers (2_A before 10_A)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def run_folders(sweep_dir: str) -> list[Path]:
    """The folders under `sweep_dir` holding a summary.json, in natural order."""
    return sorted((p.parent for p in Path(sweep_dir).rglob(SUMMARY)), key=natural_key)


def load(sweep_dir: str) -> list[dict]:
    """The summaries of every run under `sweep_dir` in natural folder order, each with its folder's name as `job`
    and its command-line overrides as `overrides` ({key: value}; {} where the folder has none)."""
    out = []
    for folder in run_folders(sweep_dir):
        summary = json.loads((folder / SUMMARY).read_text())
        out.append({**summary, "job": folder.name, "overrides": read_overrides(folder / OVERRIDES)})
    return out


def read_overrides(path: Path) -> dict[str, str]:
    """{key: value} of a Hydra overrides.yaml (a list of "key=value" lines); hydra.* keys left out."""
    if not path.exists():
        return {}
    pairs = (str(item).partition("=") for item in OmegaConf.load(path))  # "~key" (a deletion) has no value
    return {key.lstrip("+~"): value for key, _, value in pairs if not key.lstrip("+~").startswith("hydra")}


def swept_keys(summaries: list[dict]) -> list[str]:
    """The override keys whose value differs between runs (a run without the key counts as its own value), in
    the order they first appear; the model's own keys (model, model.pattern, model.name) are the model column."""
    keys = list(dict.fromkeys(k for s in summaries for k in s["overrides"]))
    keys = [k for k in keys if k not in ("model", "model.pattern", "model.name")]
    return [k for k in keys if len({s["overrides"].get(k) for s in summaries}) > 1]


def eval_scales(summary: dict) -> dict[int, str]:
    """{scale: eval length} of a run: each length it was evaluated at as a multiple of its training length."""
    T = summary["seq_len"]
    return {int(L) // T: L for L in summary["eval"] if int(L) % T == 0}


def scale_label(scale: int) -> str:
    return "acc@T" if scale == 1 else f"acc@{scale}T"


def cache_len(summary: dict) -> int:
    """trainer.cache_len of the run: the largest context its cache bytes are listed at."""
    return max(int(L) for L in summary["cache_bytes"])


def frame(summaries: list[dict]) -> pd.DataFrame:
    """One row per run, the table's columns with their values unformatted (the swept keys by full name; None where
    a run did not set a swept key, was not evaluated at a length or has no throughput)."""
    swept = swept_keys(summaries)
    scales = sorted({s for summary in summaries for s in eval_scales(summary)})
    rows = []
    for s in summaries:
        lengths = eval_scales(s)
        rows.append(
            {
                "job": s["job"],
                **{k: s["overrides"].get(k) for k in swept},
                "model": s["model"],
                "layers": s["layer_kinds"],
                "params": s["params"],
                "T": s["seq_len"],
                "steps": s["steps"],
                "loss@T": s["final_loss"],
                **{scale_label(k): s["eval"][lengths[k]]["accuracy"] if k in lengths else None for k in scales},
                "tokens/s": s["tokens_per_s"],
                f"cache_bytes@{cache_len(summaries[0])}": s["cache_bytes"][str(cache_len(s))],
            }
        )
    return pd.DataFrame(rows, columns=list(rows[0]))


def table(summaries: list[dict]) -> str:
    """The sweep's table, one row per run: `frame`'s values formatted, the swept keys by their last part."""
    df, swept = frame(summaries), swept_keys(summaries)
    text = lambda v: "-" if v is None or pd.isna(v) else str(v)
    number = lambda spec: lambda v: "-" if pd.isna(v) else format(v, spec)
    formats = {k: text for k in ("job", *swept, "model", "layers", "T", "steps")}
    formats |= {"params": number(","), "loss@T": number(".3f"), "tokens/s": number(",.0f")}
    formats |= {c: number(".3f") for c in df.columns if c.startswith("acc@")}
    formats[df.columns[-1]] = human_bytes
    header = ["job", *(k.rsplit(".", 1)[-1] for k in swept), *df.columns[1 + len(swept) : -1]]
    header.append(f"cache@{tokens(cache_len(summaries[0]))}")
    rows = [header, *([formats[c](v) for c, v in row.items()] for row in df.to_dict("records"))]
    text_columns = 3 + len(swept)  # job, the swept keys, model, layers: left-aligned
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) if i < text_columns else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", help="a Hydra sweep folder (hydra.sweep.dir)")
    parser.add_argument("--csv", metavar="PATH", help="also write the values as CSV to PATH")
    parser.add_argument("--json", metavar="PATH", help="also write the values as JSON (a list of records) to PATH")
    args = parser.parse_args()
    summaries = load(args.sweep_dir)
    if not summaries:
        raise SystemExit(f"no summary.json under {args.sweep_dir!r}: did the runs finish?")
    print(table(summaries))
    if args.csv:
        frame(summaries).to_csv(args.csv, index=False)
    if args.json:
        frame(summaries).to_json(args.json, orient="records", indent=2)
    print(f"\nTensorBoard for the sweep: tensorboard --logdir {args.sweep_dir}")


if __name__ == "__main__":
    main()
