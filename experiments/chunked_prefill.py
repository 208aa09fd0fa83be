"""A chunked prefill from a cache against a prefill: the seconds to extend a snapshot of t0 tokens by one block of
`--block` tokens (a decode step of that many queries against the cache: what the Engine's prefix cache runs for a
prompt's uncached rest), for several t0, and to prefill `--prefill` tokens at once; prefix_reuse.py's small model of
`--kind` (random weights), caches of `--max-len` slots. Best and median of `--repeats` runs after a compiling one
(experiments/timing.py). Issue 44's micro case (experiments/PERF_LOG.md):

    python -m experiments.chunked_prefill --kind A --t0 256 2048 4864 7936 --block 256 --prefill 5108
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from experiments.prefix_reuse import KINDS, build
from experiments.timing import run_times
from retention.serve.snapshot import extend_checked, prefill


def times_ms(fn, repeats: int) -> tuple[float, float]:
    """(best, median) milliseconds of fn() over `repeats` runs after a compiling one.

    Args:
        fn: the call to time (its result waited for).
        repeats: the timed runs.

    Returns:
        The best and the median, in ms.
    """
    seconds = run_times(fn, repeats=repeats)
    return 1e3 * min(seconds), 1e3 * float(np.median(seconds))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=list(KINDS), default="A", help="the model (prefix_reuse.py's KINDS)")
    parser.add_argument("--t0", type=int, nargs="+", default=[256, 2048, 4864, 7936], help="tokens cached")
    parser.add_argument("--block", type=int, default=256, help="tokens each extend feeds")
    parser.add_argument("--prefill", type=int, default=5108, help="tokens of the prefill compared with")
    parser.add_argument("--max-len", type=int, default=8208, help="the caches' slots")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs after a compiling one")
    args = parser.parse_args(argv)
    longest = max(max(args.t0) + args.block, args.prefill)
    if longest > args.max_len:
        parser.error(f"--max-len must hold the longest run ({longest} tokens), got {args.max_len}")
    model = build(args.kind)
    tokens = jax.random.randint(jax.random.key(0), (1, longest), 0, model.config.vocab_size, dtype=jnp.int32)
    for t0 in args.t0:
        start, piece = prefill(model, tokens[:, :t0], max_len=args.max_len), tokens[:, t0 : t0 + args.block]
        best, median = times_ms(lambda s=start, p=piece: extend_checked(model, s, p).logits, args.repeats)
        print(f"{args.kind}: extend {t0} + {args.block} tokens: best {best:.1f} ms, median {median:.1f} ms", flush=True)
    run = lambda: prefill(model, tokens[:, : args.prefill], max_len=args.max_len).logits
    best, median = times_ms(run, args.repeats)
    print(f"{args.kind}: prefill {args.prefill} tokens: best {best:.1f} ms, median {median:.1f} ms")


if __name__ == "__main__":
    main()
