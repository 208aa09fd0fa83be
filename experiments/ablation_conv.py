"""The mixer-parts ablation behind the model presets' defaults: MQAR with the comparison's CPU recipe (2 layers,
about 100k parameters, H=4, d=16, T=32, 4 pairs, batch 128, lr 3e-3, 800 steps; `experiments/compare/presets.py`),
one `python train.py` run per variant, accuracy at T, 4T and 16T from each run's summary.json.

    python -m experiments.ablation_conv                      # every variant of VARIANTS, T=32 with 4 pairs
    python -m experiments.ablation_conv --only P P+conv4     # a few of them
    python -m experiments.ablation_conv --cell hard          # T=128 with 16 pairs (vocab 256)
Runs go to outputs/ablation_conv/<cell>/<variant>/ (a finished run is reused); the table is printed and written
to results/ablation_conv.json (merged with what is there).
"""

import argparse
import json
import os
import subprocess
import sys

from experiments.compare.presets import CPU


def variant(model: str, conv_size: int = 0, qk_norm: bool = False, *extra: str) -> list[str]:
    """The model overrides of one variant, every ablated option explicit (so a preset's defaults never leak in)."""
    return [f"model={model}", f"model.conv_size={conv_size}", f"model.qk_norm={str(qk_norm).lower()}", *extra]


# name -> the model overrides of the variant (over the CPU preset's MQAR model)
VARIANTS = {
    "A": variant("softmax"),
    "A+conv4": variant("softmax", 4),
    "A+conv4+qknorm": variant("softmax", 4, True),
    "P": variant("power"),
    "P+qknorm": variant("power", 0, True),
    "P+conv4": variant("power", 4),
    "P+conv4+qknorm": variant("power", 4, True),
    "P+conv4+qknorm-gating": variant("power", 4, True, "model.gating=false"),
    "P+conv4+qknorm+bias2": variant("power", 4, True, "model.gate_bias_init=2.0"),
    "P+conv2+qknorm": variant("power", 2, True),
    "P+conv4+qknorm+deg4": variant("power", 4, True, "model.deg=4"),
    "PA": variant("hybrid", 0, False, "model.pattern=PA"),
    "PA+conv4": variant("hybrid", 4, False, "model.pattern=PA"),
    "PA+conv4+qknorm": variant("hybrid", 4, True, "model.pattern=PA"),
}
CELLS = {
    "easy": [],  # the recipe as it is: T=32, 4 pairs, vocab 64
    "hard": ["data.seq_len=128", "data.num_kv_pairs=16", "data.vocab_size=256"],
}


def overrides(variant: str, cell: str) -> list[str]:
    """The train.py overrides of one run: the CPU preset's MQAR cell (its model and task), the cell, then the
    variant."""
    return [f"experiment={CPU.tasks['mqar'].experiment}", *CELLS[cell], *VARIANTS[variant]]


def run(variant: str, cell: str, root: str) -> dict:
    """Train one variant (unless its summary.json exists) and return {acc@T, acc@4T, acc@16T, final_loss, ...}."""
    run_dir = os.path.join(root, cell, variant)
    summary_path = os.path.join(run_dir, "summary.json")
    args = overrides(variant, cell)
    if not os.path.exists(summary_path):
        command = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *args]
        subprocess.run(command, check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    summary = json.load(open(summary_path))
    T = summary["seq_len"]
    acc = {f"acc@{s}T": summary["eval"][str(s * T)]["accuracy"] for s in (1, 4, 16)}
    keep = ("params", "final_loss", "tokens_per_s")
    return {"variant": variant, "cell": cell, **acc, **{k: summary[k] for k in keep}, "overrides": args}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=tuple(VARIANTS), default=tuple(VARIANTS))
    parser.add_argument("--cell", choices=tuple(CELLS), default="easy")
    parser.add_argument("--root", default="outputs/ablation_conv")
    parser.add_argument("--out", default="results/ablation_conv.json")
    args = parser.parse_args()
    table = json.load(open(args.out)) if os.path.exists(args.out) else {}
    for variant in args.only:
        row = run(variant, args.cell, args.root)
        table[f"{args.cell}/{variant}"] = row
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(table, f, indent=2)
    print("| cell | variant | params | acc@T | acc@4T | acc@16T | eval loss |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in table.values():
        accs = " | ".join(f"{row[f'acc@{s}T']:.3f}" for s in (1, 4, 16))
        print(f"| {row['cell']} | {row['variant']} | {row['params']} | {accs} | {row['final_loss']:.3f} |")


if __name__ == "__main__":
    main()
