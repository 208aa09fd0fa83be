"""Milliseconds per generated token against context length, for A, W, P and PPPA, on a small model.

For each pattern and context T: prefill T random tokens into caches sized for T + the timed tokens, then time
one compiled lax.fori_loop of `--tokens` greedy decode steps (the loop of `retention.generate`), after a warm-up
run of the same compiled loop; the median of `--repeats` runs, divided by the tokens. Prints a table, writes JSON.

    python -m experiments.decode_speed [--quick] [--out results/decode_speed.json]
"""

import argparse
import dataclasses
import json
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.timing import median_seconds
from retention.nn import LM, LMConfig, cache_bytes

PATTERNS = ("A", "W", "P", "PPPA")


@partial(jax.jit, static_argnames=("graphdef", "n_tokens"))
def decode_loop(graphdef, state, caches, token_B1, *, n_tokens):
    """n_tokens greedy decode steps from `caches`, all in one compiled loop; returns the last token [B, 1]."""
    model = nnx.merge(graphdef, state)

    def body(_, carry):
        token_B1, caches = carry
        logits, caches = model.decode_step(token_B1, caches)
        return jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32), caches

    return jax.lax.fori_loop(0, n_tokens, body, (token_B1, caches))[0]


def ms_per_token(model: LM, context: int, n_tokens: int, repeats: int) -> tuple[float, int]:
    """Median ms per decoded token after `context` prompt tokens, and the caches' bytes."""
    prompt = jax.random.randint(jax.random.key(context), (1, context), 0, model.config.vocab_size, dtype=jnp.int32)
    logits, caches = model.prefill(prompt, context + n_tokens)
    token_B1 = jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32)
    graphdef, state = nnx.split(model)
    run = partial(decode_loop, n_tokens=n_tokens)
    return 1e3 * median_seconds(run, graphdef, state, caches, token_B1, repeats=repeats) / n_tokens, cache_bytes(caches)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="contexts 256..2048 only (about a minute on CPU)")
    parser.add_argument("--tokens", type=int, default=64, help="decode steps per timed loop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/decode_speed.json")
    args = parser.parse_args()
    contexts = (256, 512, 1024, 2048) if args.quick else tuple(256 * 2**i for i in range(8))  # .. 32k
    base = LMConfig(
        vocab_size=256, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, window=256, dtype="float32"
    )
    print(
        f"ms per token (batch 1, median of {args.repeats} loops of {args.tokens} tokens), on {jax.devices()[0]}; "
        f"d_model {base.d_model}, {base.n_layers} layers, {base.n_heads} heads ({base.n_kv_heads} kv) of "
        f"{base.head_dim}, window {base.window}"
    )
    print(f"{'context':>8} " + " ".join(f"{p:>8}" for p in PATTERNS))
    results = {p: {} for p in PATTERNS}
    models = {p: LM(dataclasses.replace(base, pattern=p), rngs=nnx.Rngs(0)) for p in PATTERNS}
    for context in contexts:
        for p in PATTERNS:
            ms, nbytes = ms_per_token(models[p], context, args.tokens, args.repeats)
            results[p][str(context)] = {"ms_per_token": ms, "cache_bytes": nbytes}
        print(f"{context:>8} " + " ".join(f"{results[p][str(context)]['ms_per_token']:>8.3f}" for p in PATTERNS))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"config": vars(base), "tokens": args.tokens, "repeats": args.repeats, "device": str(jax.devices()[0])}
    out.write_text(json.dumps({**meta, "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
