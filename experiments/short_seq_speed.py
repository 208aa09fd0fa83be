"""Short-sequence training throughput: the trainer's compiled train step (forward, backward, AdamW) of the
comparison's CPU MQAR models (2 layers, about 100k parameters, H=4, d=16) at T <= 256, power retention against
softmax, with any extra model overrides as variants. All variants are timed in one run, interleaved repeat by
repeat, so a change in the machine's load hits them alike; the load average is recorded next to the numbers.

    python -m experiments.short_seq_speed                         # T = 32 48 64 128 256, batch 128
    python -m experiments.short_seq_speed --lengths 32 --variant conv4=model.conv_size=4
Writes results/short_seq_speed.json.
"""

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.compare.models import compose_config
from retention.data import Batch
from retention.nn import LM
from retention.train.config import make_lm_config
from retention.train.optimizer import make_optimizer
from retention.train.step import TraceCount, device_batch, make_train_step

MODEL = [
    "model.n_layers=2",
    "model.n_heads=4",
    "model.n_kv_heads=4",
    "model.head_dim=16",
    "model.window=32",
    "model.target_params=100000",
]
VOCAB = 64  # the MQAR recipe's


def compiled_step(overrides: list[str], T: int, B: int):
    """(a function running one train step from the last one's state, the model's d_model) for a [B, T] batch."""
    cfg = compose_config([*MODEL, *overrides])
    lm = make_lm_config(cfg.model, VOCAB)
    graphdef, params = nnx.split(LM(lm, rngs=nnx.Rngs(0)))
    tx, _ = make_optimizer(cfg.optim, 1000)
    state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}
    tokens = jax.random.randint(jax.random.key(T), (B, T + 1), 0, VOCAB, dtype=jnp.int32)
    batch = device_batch(Batch(tokens[:, :-1], tokens[:, 1:]))
    compiled = make_train_step(graphdef, tx, TraceCount()).lower(state, batch).compile()

    def step():
        nonlocal state
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)

    step()  # warm-up
    return step, lm.d_model


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 48, 64, 128, 256])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="name=override[,override...] (e.g. power_conv=model=power,model.conv_size=4); default: softmax, power",
    )
    parser.add_argument("--out", default="results/short_seq_speed.json")
    args = parser.parse_args()
    variants = {"softmax": ["model=softmax"], "power": ["model=power"]}
    for spec in args.variant:
        name, overrides = spec.split("=", 1)
        variants[name] = overrides.split(",")
    rows = []
    for T in args.lengths:
        steps = {name: compiled_step(overrides, T, args.batch) for name, overrides in variants.items()}
        times = {name: [] for name in variants}
        load_before = os.getloadavg()[0]
        for _ in range(args.repeats):
            for name, (step, _) in steps.items():
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
        load_after = os.getloadavg()[0]
        base = args.batch * T / float(np.median(times["softmax"]))
        for name, (_, d_model) in steps.items():
            seconds = float(np.median(times[name]))
            tokens_per_s = args.batch * T / seconds
            row = dict(variant=name, T=T, batch=args.batch, d_model=d_model, step_ms=1e3 * seconds)
            row |= dict(
                tokens_per_s=tokens_per_s, softmax_over_this=base / tokens_per_s, load=[load_before, load_after]
            )
            rows.append(row)
            print(
                f"T={T:4d} {name:>14}: {1e3 * seconds:7.2f} ms/step {tokens_per_s:9.0f} tok/s "
                f"(softmax / this {base / tokens_per_s:.2f}x) load {load_before:.1f}-{load_after:.1f}",
                flush=True,
            )
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"batch": args.batch, "repeats": args.repeats, "variants": variants, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
