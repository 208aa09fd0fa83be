"""Cache bytes per sequence against context length, next to the model's weight bytes, for A, W, P and PPPA.

Everything is computed from shapes (jax.eval_shape / nnx.eval_shape): nothing is allocated, so 1M tokens take no
memory and the script runs in seconds. Prints a table, writes JSON next to the PNG plot (--out).

    python -m experiments.cache_memory [--out results/cache_memory.png]
"""

import argparse
import json
from functools import partial
from pathlib import Path

import jax
from flax import nnx
from matplotlib.figure import Figure

from experiments.formatting import human_bytes
from retention.nn import LM, LMConfig, cache_bytes
from retention.serve.quantized_state import quantize_caches

PATTERNS = ("A", "W", "P", "PPPA")
CONTEXTS = tuple(1024 * 2**i for i in range(11))  # 1k .. 1M tokens
MIB = 2**20


def sequence_cache_bytes(model: LM, length: int, state_format=None) -> int:
    """Decode-cache bytes of one sequence at `length` tokens (shapes only: nothing is allocated).

    Args:
        model: the LM (may be abstract, from nnx.eval_shape).
        length: tokens the caches hold (a KV cache grows with it; a recurrent state does not).
        state_format: None (float32 states), or one of retention.serve's STATE_FORMATS: the recurrent states
            stored as `quantize_caches` stores them (values and a scale per row).

    Returns:
        The bytes of every array of the caches.
    """
    caches = jax.eval_shape(partial(model.init_caches, 1, length))
    if state_format is not None:
        caches = jax.eval_shape(partial(quantize_caches, state_format=state_format), caches)
    return cache_bytes(caches)


def measure(config: LMConfig, contexts) -> dict:
    """Weight bytes and cache bytes (batch 1) at each context, and the context where the cache outgrows the
    weights (solved exactly: cache bytes are affine in the context), or None if it never does."""
    model = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
    weights = cache_bytes(nnx.state(model, nnx.Param))
    sizes = [sequence_cache_bytes(model, ctx) for ctx in contexts]
    base = sequence_cache_bytes(model, 1)
    per_token = sequence_cache_bytes(model, 2) - base
    if per_token == 0:
        crossover = None if base <= weights else 1
    else:
        crossover = max(1, -(-(weights - base) // per_token))
    return {
        "weight_bytes": weights,
        "params": model.param_count(),
        "cache_bytes": dict(zip(map(str, contexts), sizes)),
        "cache_bytes_per_token": per_token,
        "crossover_context": crossover,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/cache_memory.png", help="plot path; the JSON goes beside it")
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--dtype", default="bfloat16", help="compute/KV-cache and parameter dtype")
    args = parser.parse_args()

    results = {}
    for pattern in PATTERNS:
        config = LMConfig(
            vocab_size=args.vocab,
            d_model=args.d_model,
            n_layers=args.layers,
            pattern=pattern,
            n_heads=args.heads,
            n_kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            window=args.window,
            dtype=args.dtype,
            param_dtype=args.dtype,
        )
        results[pattern] = measure(config, CONTEXTS)

    print(
        f"cache bytes per sequence; d_model {args.d_model}, {args.layers} layers, {args.heads} heads "
        f"({args.kv_heads} kv) of {args.head_dim}, window {args.window}, {args.dtype} weights and KV cache, "
        "float32 retention state"
    )
    print(f"{'context':>9} " + " ".join(f"{p:>11}" for p in PATTERNS))
    for ctx in CONTEXTS:
        print(f"{ctx:>9} " + " ".join(f"{human_bytes(results[p]['cache_bytes'][str(ctx)]):>11}" for p in PATTERNS))
    print(f"{'weights':>9} " + " ".join(f"{human_bytes(results[p]['weight_bytes']):>11}" for p in PATTERNS))
    for p in PATTERNS:
        r = results[p]
        when = "never" if r["crossover_context"] is None else f"from {r['crossover_context']:,} tokens on"
        print(f"{p:>5}: {r['params'] / 1e6:.1f}M params; cache larger than the weights: {when}")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    out.with_suffix(".json").write_text(json.dumps({"config": meta, "results": results}, indent=2))
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for p in PATTERNS:
        ax.plot(CONTEXTS, [results[p]["cache_bytes"][str(c)] / MIB for c in CONTEXTS], marker="o", label=f"{p} cache")
    weights = [results[p]["weight_bytes"] for p in PATTERNS]
    spread = (max(weights) - min(weights)) / min(weights)
    ax.axhline(weights[0] / MIB, color="k", ls="--", label=f"weights (all patterns within {spread:.1%})")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="context (tokens)",
        ylabel="MiB per sequence",
        title="Decode cache vs context",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
