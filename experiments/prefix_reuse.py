"""Prefix reuse: N requests share a prefix and each adds a short suffix and generates a few tokens; time to first
token and total time when (a) every request recomputes the prefix, or (b) the prefix is prefilled once into a
snapshot and each request continues from it, for P, softmax (A), 4-bit-KV softmax and a PA hybrid; and the bytes
held per cached prefix (`snapshot_bytes`). Times are medians after a compiling warm-up (experiments/timing.py).

    python -m experiments.prefix_reuse [--lengths 256 1024] [--out results/prefix_reuse.json]

The issue's protocol, 1k to 64k-token prefixes, a 128-token suffix and 32 new tokens per request, on an idle
machine (recomputing a 64k prefix for every request is the slow part; `--kinds` runs a subset):

    python -m experiments.prefix_reuse --lengths 1024 4096 16384 65536 --suffix 128 --new 32 --note "idle"
"""

import argparse
import dataclasses
import json
import os
import platform
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx
from matplotlib.figure import Figure

from experiments.timing import median_seconds
from retention import generate, prefill, snapshot_bytes
from retention.nn import LM, LMConfig

BASE = LMConfig(vocab_size=256, d_model=64, n_layers=2, pattern="P", n_heads=4, n_kv_heads=4, head_dim=16)
KINDS = {
    "P": {"pattern": "P"},
    "A": {"pattern": "A"},
    "A 4-bit KV": {"pattern": "A", "kv_cache_bits": 4},
    "PA": {"pattern": "PA"},
}


def measure(
    model: LM, prefix_len: int, requests: int, suffix_len: int, new: int, repeats: int = 3, recompute: bool = True
) -> dict:
    """Seconds to first token and in all, per request, recomputing the prefix (unless `recompute` is False: None)
    or continuing a snapshot of it (medians of `repeats` timed runs after a compiling one)."""
    key = jax.random.key(prefix_len)
    prefix = jax.random.randint(key, (1, prefix_len), 0, BASE.vocab_size, dtype=jnp.int32)
    suffixes = jax.random.randint(jax.random.fold_in(key, 1), (requests, 1, suffix_len), 0, BASE.vocab_size)
    suffixes = suffixes.astype(jnp.int32)
    full = lambda s: jnp.concatenate([prefix, s], axis=1)
    run_all = lambda n: [generate(model, full(s), n, temperature=0.0).tokens.block_until_ready() for s in suffixes]
    snapshot = prefill(model, prefix, max_len=prefix_len + suffix_len + new)
    from_snapshot = lambda n: [
        generate(model, s, n, temperature=0.0, start=snapshot).tokens.block_until_ready() for s in suffixes
    ]
    prefill_s = median_seconds(
        lambda: prefill(model, prefix, max_len=prefix_len + suffix_len + new).logits.block_until_ready(),
        repeats=repeats,
    )
    return {
        "prefix_len": prefix_len,
        "bytes_per_cached_prefix": snapshot_bytes(snapshot),
        "recompute": {
            "ttft_s": median_seconds(run_all, 1, repeats=repeats) / requests,
            "total_s": median_seconds(run_all, new, repeats=repeats) / requests,
        }
        if recompute
        else None,
        "snapshot": {
            "prefill_once_s": prefill_s,
            "ttft_s": median_seconds(from_snapshot, 1, repeats=repeats) / requests,
            "total_s": median_seconds(from_snapshot, new, repeats=repeats) / requests,
        },
    }


def plot(results: dict, path: Path) -> None:
    figure = Figure(figsize=(10, 4))
    bytes_ax, ttft_ax = figure.subplots(1, 2)
    for kind, rows in results.items():
        lengths = [r["prefix_len"] for r in rows]
        bytes_ax.plot(lengths, [r["bytes_per_cached_prefix"] for r in rows], marker="o", label=kind)
        ttft_ax.plot(lengths, [r["snapshot"]["ttft_s"] * 1e3 for r in rows], marker="o", label=f"{kind} snapshot")
        timed = [r for r in rows if r["recompute"]]
        ttft_ax.plot(
            [r["prefix_len"] for r in timed],
            [r["recompute"]["ttft_s"] * 1e3 for r in timed],
            ls="--",
            label=f"{kind} recompute",
        )
    for ax, title in ((bytes_ax, "bytes per cached prefix"), (ttft_ax, "time to first token (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prefix tokens")
        ax.set_title(title)
    bytes_ax.legend()
    ttft_ax.legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024], help="shared prefix tokens (1k-64k)")
    parser.add_argument("--requests", type=int, default=4, help="requests sharing the prefix")
    parser.add_argument("--suffix", type=int, default=32, help="tokens each request adds (the issue's: 128)")
    parser.add_argument("--new", type=int, default=8, help="tokens each request generates (the issue's: 32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per median, after a compiling one")
    parser.add_argument(
        "--recompute-max",
        type=int,
        help="longest prefix whose per-request recompute is timed (longer: the snapshot path only, recompute None)",
    )
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS), help="models to measure")
    parser.add_argument(
        "--note", default="a CPU shared with other jobs: times are indicative, bytes exact", help="the machine"
    )
    parser.add_argument("--out", default="results/prefix_reuse.json", help="JSON path; the PNG goes beside it")
    args = parser.parse_args(argv)
    results = {}
    for kind in args.kinds:
        fields = KINDS[kind]
        model = LM(dataclasses.replace(BASE, **fields), rngs=nnx.Rngs(0))
        recompute = lambda n: args.recompute_max is None or n <= args.recompute_max
        results[kind] = [
            measure(model, n, args.requests, args.suffix, args.new, args.repeats, recompute(n)) for n in args.lengths
        ]
        for row in results[kind]:
            print(kind, json.dumps(row))
    out = Path(args.out)
    machine = {
        "device": jax.devices()[0].device_kind,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "note": args.note,
    }
    setup = dict(config=dataclasses.asdict(BASE), requests=args.requests, suffix=args.suffix, new=args.new)
    setup.update(repeats=args.repeats, recompute_max=args.recompute_max)
    out.write_text(json.dumps({"machine": machine, "setup": setup, "results": results}, indent=1) + "\n")
    plot(results, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
