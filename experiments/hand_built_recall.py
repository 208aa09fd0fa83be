"""Capacity, not optimisation: the MQAR accuracy of a hand-built power-retention layer, no training.

The layer is what a trained one could be at best: the short convolution gives each position s the previous token
as its key and its own token as its value, k_s = e(x_{s-1}) (zero unless x_{s-1} is a key id) and v_s = onehot(x_s);
the query at t is q_t = e(x_t), so a query matches its key exactly (q.k = 1) and meets any other key only through
the overlap of two embeddings e (random unit vectors in R^d, E[cos^2] = 1/d). Each of `heads` heads has its own
embedding; the heads' normalised outputs add, as the output projection would; the answer is the value id with the
largest output. With w_ts = (q_t.k_s)^deg (power retention's weights, no gate) a filler token that repeats the
query's key before the query writes a competing value with the same weight as the true pair.

Accuracy on the trainer's MQAR batches (retention/data/mqar.py, the eval split) against head dim, degree, gap and
the filler (MQAR's `filler`: `vocab`, drawn from the whole vocabulary as in Zoology; `values`, value ids only, so
no key repeats), written as JSON:

    python -m experiments.hand_built_recall --out results/hand_built_recall.json
"""

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np

from retention.data.mqar import MQAR

FAR_CELL = {"seq_len": 64, "vocab_size": 128, "num_kv_pairs": 4}  # configs/experiment/mqar_demo.yaml's cell


def embeddings(vocab_size: int, heads: int, head_dim: int, rng: np.random.Generator) -> np.ndarray:
    """[heads, vocab_size, head_dim] random unit vectors, one table per head."""
    e = rng.standard_normal((heads, vocab_size, head_dim))
    return e / np.linalg.norm(e, axis=-1, keepdims=True)


def layer_qkv(inputs_BT: np.ndarray, e_HVd: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q [B, H, T, d], k [B, H, T, d] and one-hot v [B, T, V] of the hand-built layer on token ids [B, T]: k_s is
    e(x_{s-1}) when x_{s-1} is a key id (1..n_keys), else 0 (k_0 = 0); v_s = onehot(x_s); q_t = e(x_t)."""
    V = e_HVd.shape[1]
    q = np.moveaxis(e_HVd[:, inputs_BT], 0, 1)  # [B, H, T, d]
    previous = np.concatenate([np.zeros_like(inputs_BT[:, :1]), inputs_BT[:, :-1]], axis=1)
    is_key = ((previous >= 1) & (previous <= n_keys))[:, None, :, None]
    k = np.where(is_key, np.moveaxis(e_HVd[:, previous], 0, 1), 0.0)
    k[:, :, 0] = 0.0
    v = np.eye(V)[inputs_BT]
    return q, k, v


def retention_outputs(q_BHTd, k_BHTd, v_BTV, deg: int) -> np.ndarray:
    """[B, T, V]: the sum over heads of causal power retention y_t = sum_{s<=t} w_ts v_s / sum_s w_ts with
    w_ts = (q_t.k_s)^deg (float64; a row with no weight gives 0)."""
    T = q_BHTd.shape[2]
    w = np.einsum("bhtd,bhsd->bhts", q_BHTd, k_BHTd) ** deg * np.tril(np.ones((T, T)))
    norm = w.sum(-1, keepdims=True)
    y = np.einsum("bhts,bsv->bhtv", w, v_BTV) / np.where(norm > 0, norm, 1.0)
    return y.sum(1)


def recall_accuracy(
    *,
    head_dim: int,
    deg: int,
    gap: int,
    heads: int = 4,
    filler: str = "vocab",
    batches: int = 8,
    batch: int = 128,
    seed: int = 0,
    cell: dict = FAR_CELL,
) -> float:
    """The hand-built layer's accuracy at the queries of `batches` eval batches of MQAR at min_gap `gap` (the answer:
    the value id, in the value half of the vocabulary, of largest output)."""
    data = MQAR(**cell, batch_size=batch, min_gap=gap, seed=seed, filler=filler)
    V, n_keys = data.vocab_size, data.vocab_size // 2 - 1
    e = embeddings(V, heads, head_dim, np.random.default_rng([seed, head_dim, heads]))
    correct = total = 0
    for i in range(batches):
        b = data.batch(i, split="eval")
        y = retention_outputs(*layer_qkv(b.inputs.astype(np.int64), e, n_keys), deg)
        answer = V // 2 + y[..., V // 2 :].argmax(-1)
        mask = b.targets >= 0
        correct += int((answer == b.targets)[mask].sum())
        total += int(mask.sum())
    return correct / total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/hand_built_recall.json"))
    parser.add_argument("--head-dims", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--degrees", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--gaps", type=int, nargs="+", default=[0, 16, 48])
    parser.add_argument("--heads", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args(argv)
    start, rows = time.perf_counter(), []
    grid = itertools.product(("vocab", "values"), args.heads, args.gaps, args.degrees, args.head_dims)
    for filler, heads, gap, deg, d in grid:
        acc = recall_accuracy(head_dim=d, deg=deg, gap=gap, heads=heads, filler=filler, batches=args.batches)
        rows.append({"filler": filler, "heads": heads, "gap": gap, "deg": deg, "head_dim": d, "accuracy": acc})
        print(f"filler={filler} heads={heads} gap={gap} deg={deg} d={d}: {acc:.3f}", flush=True)
    cell = {**FAR_CELL, "queries_per_row": FAR_CELL["num_kv_pairs"], "rows": args.batches * 128}
    out = {"cell": cell, "command": "python -m experiments.hand_built_recall", "rows": rows}
    out["seconds"] = time.perf_counter() - start
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
