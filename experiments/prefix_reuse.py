"""Prefix reuse: N requests share a prefix and each adds a short suffix and generates a few tokens; time to first
token and total time when (a) every request recomputes the prefix, or (b) the prefix is prefilled once into a
snapshot and each request continues from it, for P, softmax (A), 4-bit-KV softmax and a PA hybrid; and the bytes
held per cached prefix (`snapshot_bytes`). Times are medians after a compiling warm-up (experiments/timing.py).

    python -m experiments.prefix_reuse [--lengths 256 1024] [--out results/prefix_reuse.json]
    python -m experiments.prefix_reuse --plot-only    # redraw results/prefix_reuse.png from the JSON

The issue's protocol, 1k to 64k-token prefixes, a 128-token suffix and 32 new tokens per request, on an idle
machine (recomputing a 64k prefix for every request is the slow part; `--kinds` runs a subset):

    python -m experiments.prefix_reuse --lengths 1024 4096 16384 65536 --suffix 128 --new 32 --note "idle"
"""

import argparse
import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx
from matplotlib.figure import Figure

from experiments.plotting import color, log_ticks, save
from experiments.timing import machine, median_seconds
from retention import generate, prefill, snapshot_bytes
from retention.nn import LM, LMConfig

COLORS = {"P": color("power"), "A": color("softmax"), "A 4-bit KV": "C8", "PA": color("hybrid")}  # one per model
MIB = 2**20
BASE = LMConfig(vocab_size=256, d_model=64, n_layers=2, pattern="P", n_heads=4, n_kv_heads=4, head_dim=16)
KINDS = {
    "P": {"pattern": "P"},
    "A": {"pattern": "A"},
    "A 4-bit KV": {"pattern": "A", "kv_cache_bits": 4},
    "PA": {"pattern": "PA"},
}


def build(kind: str) -> LM:
    """The benchmark's small model of `kind` (a name of KINDS) with random weights (nnx.Rngs(0)): serving costs
    only, not quality."""
    return LM(dataclasses.replace(BASE, **KINDS[kind]), rngs=nnx.Rngs(0))


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


def figure(results: dict) -> Figure:
    """Bytes per cached prefix and time to first token against prefix length, one color per model in both panels
    (the comparison's colors: P as power, A as softmax, PA as the hybrid); solid: continuing a snapshot of the
    prefix, dashed: recomputing it for every request.

    Args:
        results: prefix_reuse.json's "results", {model: [measure's row per prefix length]}.

    Returns:
        The figure, two panels.
    """
    fig = Figure(figsize=(10, 4))
    bytes_ax, ttft_ax = fig.subplots(1, 2)
    for kind, rows in results.items():
        lengths, style = [r["prefix_len"] for r in rows], dict(color=COLORS[kind], marker="o")
        bytes_ax.plot(lengths, [r["bytes_per_cached_prefix"] / MIB for r in rows], label=kind, **style)
        ttft_ax.plot(lengths, [r["snapshot"]["ttft_s"] * 1e3 for r in rows], label=f"{kind} snapshot", **style)
        timed = [r for r in rows if r["recompute"]]
        recompute = [r["recompute"]["ttft_s"] * 1e3 for r in timed]
        ttft_ax.plot([r["prefix_len"] for r in timed], recompute, ls="--", label=f"{kind} recompute", **style)
    bytes_ax.set(title="memory per cached prefix", ylabel="cached prefix (MiB)", yscale="log")
    ttft_ax.set(title="time to first token, per request", ylabel="time to first token (ms)", yscale="log")
    every = sorted({r["prefix_len"] for rows in results.values() for r in rows})
    for ax in (bytes_ax, ttft_ax):
        ax.set_xlabel("prefix (tokens)")
        log_ticks(ax, every)
        ax.grid(alpha=0.3, which="both")
    bytes_ax.legend()
    ttft_ax.legend(fontsize=6)
    return fig


def parse_flags(parser: argparse.ArgumentParser, argv, out: str) -> argparse.Namespace:
    """`parser`'s flags with those the serving benchmarks share added (--kinds, --note, --out defaulting to `out`,
    --plot-only), parsed from argv."""
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS), help="models to measure")
    parser.add_argument(
        "--note", default="a CPU shared with other jobs: times are indicative, bytes exact", help="the machine"
    )
    parser.add_argument("--out", default=out, help="JSON path; the PNG goes beside it")
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from --out's JSON, measuring nothing")
    return parser.parse_args(argv)


def redraw(figure, out: Path) -> None:
    """The PNG beside the JSON `out` redrawn by `figure` from its "results" (--plot-only)."""
    save(figure(json.loads(out.read_text())["results"]), out.with_suffix(".png"))


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
    args = parse_flags(parser, argv, "results/prefix_reuse.json")
    out = Path(args.out)
    if args.plot_only:
        return redraw(figure, out)
    results = {}
    for kind in args.kinds:
        model = build(kind)
        recompute = lambda n: args.recompute_max is None or n <= args.recompute_max
        results[kind] = [
            measure(model, n, args.requests, args.suffix, args.new, args.repeats, recompute(n)) for n in args.lengths
        ]
        for row in results[kind]:
            print(kind, json.dumps(row))
    setup = dict(config=dataclasses.asdict(BASE), requests=args.requests, suffix=args.suffix, new=args.new)
    setup.update(repeats=args.repeats, recompute_max=args.recompute_max)
    out.write_text(json.dumps({"machine": machine(args.note), "setup": setup, "results": results}, indent=1) + "\n")
    save(figure(results), out.with_suffix(".png"))


if __name__ == "__main__":
    main()
