"""Compile time and XLA's memory analysis of the trainer's train step against depth, the blocks scanned
(`scan_layers`) or looped in Python, under each remat policy asked for. Nothing runs: each step is lowered and
compiled from shapes alone (jax.eval_shape), so the numbers are the compiler's, and the times are wall seconds of
`lower` and `compile` on this machine (one measurement each; compile time is what scanning changes).

    python -m experiments.scan_compile [--depths 2 4 8 16] [--remat none full] [--out results/scan_compile.json]
"""

import argparse
import dataclasses
import json
import pathlib
import time

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.formatting import human_bytes
from retention.data import Batch
from retention.nn import LM, LMConfig
from retention.train.config import OptimConfig
from retention.train.optimizer import make_optimizer
from retention.train.step import TraceCount, device_batch, make_init, make_train_step

BASE = LMConfig(vocab_size=256, d_model=32, n_heads=2, n_kv_heads=2, head_dim=16, pattern="PA", chunk_size=64)


def measure(config: LMConfig, batch: int, seq_len: int) -> dict:
    """Seconds to trace and lower, and to compile, the train step on [batch, seq_len] tokens, and its memory
    analysis (temporaries, arguments, outputs, in bytes)."""
    tx, _ = make_optimizer(OptimConfig(), 1000)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0))))
    state = jax.eval_shape(make_init(config, tx, 0))
    tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    step = make_train_step(graphdef, tx, TraceCount())
    start = time.perf_counter()
    lowered = step.lower(state, device_batch(Batch(tokens, tokens), put=lambda x: x))
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    memory = compiled.memory_analysis()
    return {
        "lower_s": lowered_at - start,
        "compile_s": done - lowered_at,
        "temp_bytes": memory.temp_size_in_bytes,
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "hlo_chars": len(lowered.as_text()),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8, 16], help="n_layers (even)")
    parser.add_argument("--remat", nargs="+", default=["none"], help="remat policies to compare")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--out", default="results/scan_compile.json")
    args = parser.parse_args()
    rows = []
    print(f"{'layers':>6} {'scan':>5} {'remat':>16} {'lower s':>8} {'compile s':>9} {'temp':>10} {'HLO chars':>10}")
    for depth in args.depths:
        for policy in args.remat:
            for scan in (False, True):
                config = dataclasses.replace(BASE, n_layers=depth, scan_layers=scan, remat_policy=policy)
                row = {"n_layers": depth, "scan_layers": scan, "remat_policy": policy}
                row.update(measure(config, args.batch, args.seq_len))
                rows.append(row)
                print(
                    f"{depth:>6} {str(scan):>5} {policy:>16} {row['lower_s']:>8.2f} {row['compile_s']:>9.2f} "
                    f"{human_bytes(row['temp_bytes']):>10} {row['hlo_chars']:>10}"
                )
    meta = {
        "config": dataclasses.asdict(BASE),
        "batch": args.batch,
        "seq_len": args.seq_len,
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
