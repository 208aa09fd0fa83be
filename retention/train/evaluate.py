"""Evaluation: named scalar metrics of the model on held-out batches at each eval length.

`evaluate` returns {name: value}; the loop writes each as the TensorBoard tag `eval/x{scale}/{name}` (scale =
eval length / training length, so runs trained at different lengths share tags) and summary.json keeps them
under `eval[<length>]`. A new family of metrics adds its names to the dict `evaluate` returns.
"""

import jax
import jax.numpy as jnp

from retention.train.config import Config
from retention.train.step import device_batch, ratios


def eval_sets(cfg: Config, dataset, seq_len: int) -> dict:
    """name prefix -> function of a batch index giving an eval batch at seq_len (passkey: also one set per depth)."""
    sets = {"": lambda i: dataset.batch(i, seq_len=seq_len, split="eval")}
    if cfg.data.task == "passkey":
        for depth in dataset.depths:
            sets[f"depth{depth:g}/"] = lambda i, d=depth: dataset.batch(i, seq_len=seq_len, split="eval", depth=d)
    return sets


def evaluate(eval_step, params, cfg: Config, dataset, seq_len: int, put=jnp.asarray) -> dict[str, float]:
    """loss, accuracy and exact_match over trainer.eval_batches eval batches at seq_len, for each eval set (names
    prefixed by the set's); `put` places a host batch on the devices."""
    out = {}
    for prefix, make_batch in eval_sets(cfg, dataset, seq_len).items():
        total = None
        for i in range(cfg.trainer.eval_batches):
            sums = eval_step(params, device_batch(make_batch(i), put))
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
        out.update({prefix + k: v for k, v in ratios(total).items()})
    return out


def evaluate_scales(eval_step, params, cfg: Config, dataset, put=jnp.asarray) -> dict[int, dict[str, float]]:
    """{scale: evaluate(...) at data.seq_len * scale} for each of trainer.eval_scales."""
    return {s: evaluate(eval_step, params, cfg, dataset, s * cfg.data.seq_len, put) for s in cfg.trainer.eval_scales}
