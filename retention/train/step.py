"""The compiled train and eval steps: masked next-token cross-entropy, its metrics, and one AdamW update.

The train step takes and returns the whole train state {params, opt_state, step} and donates it, so the update
runs in place; it is compiled once per run (a `TraceCount` counts the traces: a second one is a retrace).
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jaxtyping import Array, Float, Int

from retention.data import IGNORE


class TraceCount:
    """How many times a step function has been traced (each trace is a compilation)."""

    def __init__(self):
        self.count = 0


def masked_sums(
    logits_BTV: Float[Array, "B T V"], targets_BT: Int[Array, "B T"]
) -> dict[str, Float[Array, ""]]:
    """Sums over the labelled positions (targets != IGNORE): nll, correct argmax, labels; and over the rows
    with a label: exact (every label right) and rows."""
    mask_BT = targets_BT != IGNORE
    logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    safe_BT = jnp.where(mask_BT, targets_BT, 0)
    nll_BT = -jnp.take_along_axis(logp_BTV, safe_BT[..., None], axis=-1)[..., 0]
    correct_BT = (jnp.argmax(logits_BTV, axis=-1) == targets_BT) & mask_BT
    has_label_B = jnp.any(mask_BT, axis=1)
    exact_B = jnp.all(correct_BT | ~mask_BT, axis=1) & has_label_B
    f32 = lambda x: jnp.sum(x, dtype=jnp.float32)
    return {
        "nll": f32(jnp.where(mask_BT, nll_BT, 0.0)),
        "correct": f32(correct_BT),
        "labels": f32(mask_BT),
        "exact": f32(exact_B),
        "rows": f32(has_label_B),
    }


def ratios(sums: dict) -> dict[str, float]:
    """loss, accuracy and exact_match from (summed) `masked_sums`."""
    labels, rows = max(float(sums["labels"]), 1.0), max(float(sums["rows"]), 1.0)
    return {"loss": float(sums["nll"]) / labels, "accuracy": float(sums["correct"]) / labels,
            "exact_match": float(sums["exact"]) / rows}  # fmt: skip


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, traces: TraceCount):
    """jit(state, inputs [B, T], targets [B, T]) -> (new state, {loss, accuracy, grad_norm}); state donated."""

    def train_step(state, inputs_BT, targets_BT):
        traces.count += 1

        def loss_fn(params):
            sums = masked_sums(nnx.merge(graphdef, params)(inputs_BT), targets_BT)
            return sums["nll"] / jnp.maximum(sums["labels"], 1.0), sums

        (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": loss, "accuracy": sums["correct"] / jnp.maximum(sums["labels"], 1.0),
                   "grad_norm": optax.tree.norm(grads)}  # fmt: skip
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    return jax.jit(train_step, donate_argnums=0)


def make_eval_step(graphdef: nnx.GraphDef):
    """jit(params, inputs [B, T], targets [B, T]) -> masked_sums of the forward (compiled once per length)."""
    return jax.jit(lambda params, inputs_BT, targets_BT: masked_sums(nnx.merge(graphdef, params)(inputs_BT),
                                                                    targets_BT))  # fmt: skip
