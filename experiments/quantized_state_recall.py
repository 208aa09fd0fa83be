"""Does a quantized state's error accumulate? Recall of the hand-built power-retention layer
(experiments/hand_built_recall.py: q and k match exactly, v one-hot) against length with its state float32,
quantized only at rest (the float state quantized once, at the length read), and re-quantized after every token
(the live state: `round_trip_rows` on S and z, as `generate(..., state_format=...)` does), for int8 and fp8 e4m3
with a scale per state row; and the bytes of each state beside a 4-bit KV cache of the same length (the registry's
formulas). Beside the accuracies, the relative error of S against the float state (does it grow with the number
of re-quantizations?).

Each row of the batch writes n_pairs (key, value) pairs, then distractor pairs (other keys, random values) up to
the length, so the state changes at every second token; at each length read the query of every true key reads the
state (y = phi(q) S / phi(q) z) and answers the value id of largest output. The state runs token by token through
the step op (`power_retention_step`) in one compiled loop per treatment.

    python -m experiments.quantized_state_recall [--lengths 256 1024 2048 4096 8192] \
        [--out results/quantized_state_recall.json]
"""

import argparse
import dataclasses
import json
import platform
import sys
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments.hand_built_recall import embeddings, layer_qkv
from retention.nn import LMConfig
from retention.nn.registry import MIXERS
from retention.ops import RetentionState, init_state, power_retention_step
from retention.ops.power_retention.chunk_math import normalise, state_read
from retention.ops.power_retention.state import augment
from retention.serve.quantized_state import quantize_rows, round_trip_rows

HEAD_DIM, DEG = 32, 2
N_PAIRS, N_KEYS = 4, 16  # true keys 1..N_PAIRS, distractor keys N_PAIRS+1..N_KEYS, values above N_KEYS
VOCAB = HEAD_DIM  # v is one-hot over the vocabulary, as wide as the head


def streams(batch: int, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Token ids [batch, length] (the true pairs, then distractor pairs) and each row's true values [batch, N_PAIRS]."""
    values = rng.integers(N_KEYS + 1, VOCAB, size=(batch, length // 2))
    keys = rng.integers(N_PAIRS + 1, N_KEYS + 1, size=(batch, length // 2))
    keys[:, :N_PAIRS] = np.arange(1, N_PAIRS + 1)
    return np.stack([keys, values], axis=-1).reshape(batch, length), values[:, :N_PAIRS]


def _round_trip(state: RetentionState, state_format) -> RetentionState:
    return RetentionState(*(round_trip_rows(x, state_format) for x in state))


@partial(jax.jit, static_argnames=("state_format", "reads"))
def states_at(q_BTHd, k_BTHd, v_BTHd, *, state_format, reads: tuple[int, ...]) -> RetentionState:
    """The state after each length in `reads` (S [R, B, 1, D, d], z [R, B, 1, D]), token by token from empty,
    re-quantized after every token when state_format is given."""
    B = q_BTHd.shape[0]

    def step(t, state):
        token = [jax.lax.dynamic_slice_in_dim(x, t, 1, axis=1) for x in (q_BTHd, k_BTHd, v_BTHd)]
        _, state = power_retention_step(state, *token, deg=DEG)
        return state if state_format is None else _round_trip(state, state_format)

    state, kept, done = init_state(B, 1, HEAD_DIM, DEG), [], 0
    for length in reads:  # only the read states are kept, not one per token
        state = jax.lax.fori_loop(done, length, step, state)
        kept.append(state)
        done = length
    return jax.tree.map(lambda *x: jnp.stack(x), *kept)


def accuracy(state: RetentionState, e_HVd: np.ndarray, answers_BP: np.ndarray) -> float:
    """The share of the true keys whose read of the state answers their value."""
    q = jnp.asarray(e_HVd[0, 1 : N_PAIRS + 1], jnp.float32)  # [P, d]: the true keys' queries
    q_BHPd = jnp.broadcast_to(q, (answers_BP.shape[0], 1) + q.shape)
    y = normalise(state_read(q_BHPd * HEAD_DIM**-0.5, augment(state), DEG))[:, 0]  # [B, P, V]
    answer = N_KEYS + 1 + np.asarray(jnp.argmax(y[..., N_KEYS + 1 :], axis=-1))
    return float(np.mean(answer == answers_BP))


def relative_error(state: RetentionState, exact: RetentionState) -> float:
    """||S - S_exact|| / ||S_exact|| over the whole batch (Frobenius): how far a treated state is from the float one."""
    return float(jnp.linalg.norm(state.S - exact.S) / jnp.linalg.norm(exact.S))


def state_bytes(state_format, length: int) -> dict:
    """Bytes of one kv-head's state per format, beside a 4-bit KV cache of `length` tokens (registry formulas)."""
    config = LMConfig(vocab_size=VOCAB, d_model=HEAD_DIM, n_layers=1, pattern="P", n_heads=1, n_kv_heads=1,
                      head_dim=HEAD_DIM, deg=DEG)  # fmt: skip
    state = jax.eval_shape(lambda: init_state(1, 1, HEAD_DIM, DEG))
    packed = jax.eval_shape(lambda s: [quantize_rows(x, state_format) for x in s], state)
    return {
        "float32_state": MIXERS["P"].cache_bytes(config, 1, length) - 4,  # less the segment id
        "quantized_state": sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(packed)),
        "kv_cache_4bit": MIXERS["A"].cache_bytes(dataclasses.replace(config, kv_cache_bits=4), 1, length),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048, 4096, 8192])
    parser.add_argument("--formats", nargs="+", default=["8", "fp8"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("results/quantized_state_recall.json"))
    args = parser.parse_args(argv)
    formats = [int(f) if f.isdigit() else f for f in args.formats]
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    e = embeddings(VOCAB, 1, HEAD_DIM, rng)
    tokens, answers = streams(args.batch, max(args.lengths), rng)
    q, k, v = layer_qkv(tokens, e, N_KEYS)
    to_op = lambda x: jnp.asarray(np.moveaxis(x, 1, 2), jnp.float32)  # [B, H, T, d] -> [B, T, H, d]
    q, k, v = to_op(q), to_op(k), jnp.asarray(v[:, :, None], jnp.float32)
    reads = tuple(sorted(args.lengths))
    exact = states_at(q, k, v, state_format=None, reads=reads)
    rows = []
    for state_format in formats:
        live = states_at(q, k, v, state_format=state_format, reads=reads)
        for i, length in enumerate(reads):
            at = lambda s, i=i: jax.tree.map(lambda x: x[i], s)
            row = {
                "state_format": state_format,
                "length": length,
                "float32": accuracy(at(exact), e, answers),
                "at_rest": accuracy(_round_trip(at(exact), state_format), e, answers),
                "every_step": accuracy(at(live), e, answers),
                "S_relative_error_at_rest": relative_error(_round_trip(at(exact), state_format), at(exact)),
                "S_relative_error_every_step": relative_error(at(live), at(exact)),
                "bytes": state_bytes(state_format, length),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = {
        "command": " ".join(["python -m experiments.quantized_state_recall", *(argv or sys.argv[1:])]),
        "setup": {
            "head_dim": HEAD_DIM,
            "deg": DEG,
            "heads": 1,
            "n_pairs": N_PAIRS,
            "distractor_keys": N_KEYS - N_PAIRS,
            "values": VOCAB - N_KEYS - 1,
            "rows": args.batch,
            "queries_per_length": args.batch * N_PAIRS,
        },  # fmt: skip
        "machine": f"{platform.node()} ({platform.processor() or platform.machine()}, {jax.default_backend()})",
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out} in {out['seconds']:.0f} s")


if __name__ == "__main__":
    main()
