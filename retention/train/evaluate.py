"""Evaluation: named scalar metrics of the model on held-out batches at each eval length.

`evaluate` returns {name: value}; the loop writes each as the TensorBoard tag `eval/x{scale}/{name}` (scale =
eval length / training length, so runs trained at different lengths share tags) and summary.json keeps them
under `eval[<length>]`. A new family of metrics adds its names to the dict `evaluate` returns.

Text adds `bits_per_byte` (the summed nll over the labelled targets / ln 2 / the UTF-8 bytes those targets stand
for, EOD counting one byte: comparable across tokenizers) and `loss_pos_{lo}_{hi}`, the mean loss of the targets
at positions [lo, hi) of the window for the buckets [0, 1), [1, 2), [2, 4), ... up to the eval length: whether
a model uses long context shows as a loss falling with position. The loop draws these buckets as one curve per
eval length (retention/train/position_plot.py): `loss_by_position.png` beside summary.json and the TensorBoard
image `eval/loss_by_position`, refreshed at each eval.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from retention.data import IGNORE
from retention.train.config import Config
from retention.train.step import device_batch, ratios


def eval_sets(cfg: Config, dataset, seq_len: int) -> dict:
    """name prefix -> function of a batch index giving an eval batch at seq_len (passkey: also one set per depth)."""
    sets = {"": lambda i: dataset.batch(i, seq_len=seq_len, split="eval")}
    if cfg.data.task == "passkey":
        for depth in dataset.depths:
            sets[f"depth{depth:g}/"] = lambda i, d=depth: dataset.batch(i, seq_len=seq_len, split="eval", depth=d)
    return sets


def position_buckets(seq_len: int) -> list[tuple[int, int]]:
    """[(0, 1), (1, 2), (2, 4), ..., (2**k, seq_len)]: powers of two up to seq_len, the last cut at seq_len."""
    edges = [0] + [2**i for i in range(max(seq_len - 1, 1).bit_length())] + [seq_len]
    return [(lo, hi) for lo, hi in zip(edges, edges[1:]) if lo < hi]


def position_key(lo: int, hi: int) -> str:
    """The metric name of the mean loss at positions [lo, hi): `loss_pos_{lo}_{hi}`."""
    return f"loss_pos_{lo}_{hi}"


def bucket_losses(nll_T: np.ndarray, labels_T: np.ndarray) -> dict[str, float]:
    """{loss_pos_{lo}_{hi}: mean loss} per position bucket, from the summed nll [T] and label counts [T] at each
    position; NaN for a bucket without a label."""
    nll_T, labels_T = np.asarray(nll_T, np.float64), np.asarray(labels_T, np.float64)
    out = {}
    for lo, hi in position_buckets(len(nll_T)):
        labels = labels_T[lo:hi].sum()
        out[position_key(lo, hi)] = nll_T[lo:hi].sum() / labels if labels else math.nan
    return out


def target_bytes(targets_BT: np.ndarray, token_bytes: np.ndarray) -> int:
    """The UTF-8 bytes the labelled targets (not IGNORE) stand for: the sum of token_bytes[target]."""
    targets = np.asarray(targets_BT)
    return int(token_bytes[targets[targets != IGNORE]].sum())


def bits_per_byte(nll: float, n_bytes: int) -> float:
    """Bits per byte of a summed nll (nats) over targets standing for n_bytes bytes (NaN without a byte)."""
    return nll / math.log(2) / n_bytes if n_bytes else math.nan


def evaluate(eval_step, params, cfg: Config, dataset, seq_len: int, put=jnp.asarray) -> dict[str, float]:
    """loss, accuracy and exact_match over trainer.eval_batches eval batches at seq_len, for each eval set (names
    prefixed by the set's); text also bits_per_byte and the loss by position bucket. `put` places a host batch
    on the devices."""
    out = {}
    text = cfg.data.task == "text"
    for prefix, make_batch in eval_sets(cfg, dataset, seq_len).items():
        total, n_bytes = None, 0
        for i in range(cfg.trainer.eval_batches):
            batch = make_batch(i)
            sums = eval_step(params, device_batch(batch, put))
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
            if text:
                n_bytes += target_bytes(batch.targets, dataset.token_bytes)
        out.update({prefix + k: v for k, v in ratios(total).items()})
        if text:
            total = jax.device_get(total)
            out[prefix + "bits_per_byte"] = bits_per_byte(float(total["nll"]), n_bytes)
            out.update({prefix + k: v for k, v in bucket_losses(total["nll_T"], total["labels_T"]).items()})
    return out


def evaluate_scales(eval_step, params, cfg: Config, dataset, put=jnp.asarray) -> dict[int, dict[str, float]]:
    """{scale: evaluate(...) at data.seq_len * scale} for each of trainer.eval_scales."""
    return {s: evaluate(eval_step, params, cfg, dataset, s * cfg.data.seq_len, put) for s in cfg.trainer.eval_scales}
