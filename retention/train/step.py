"""The compiled train and eval steps: masked next-token cross-entropy, its metrics, and one AdamW update.

Both steps take the batch as a dict of device arrays (`device_batch`: inputs, targets and, for packed text,
segment_ids [B, T]), so a new batch field is added in one place. The train step takes and returns the whole
train state {params, opt_state, step} and donates it, so the update runs in place; it is compiled once per run
(a `TraceCount` counts the traces: a second one is a retrace). Given a mesh, both steps run under it with the
state FSDP-sharded and the batch split (retention/parallel).
"""

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jaxtyping import Array, Bool, Float, Int

from retention.data import IGNORE, Batch
from retention.nn import LM, LMConfig
from retention.parallel import DEFAULT_RULES
from retention.train.distill import Distill, kl_sum, teacher_pass


class TraceCount:
    """How many times a step function has been traced (each trace is a compilation)."""

    def __init__(self):
        self.count = 0


def device_batch(batch: Batch, put=jnp.asarray) -> dict[str, jax.Array]:
    """The arrays the steps read from a host batch, each placed on the devices by `put`: inputs and targets, and
    segment_ids when the batch packs documents (text)."""
    arrays = {"inputs": batch.inputs, "targets": batch.targets}
    if batch.segment_ids is not None:
        arrays["segment_ids"] = batch.segment_ids
    return {name: put(x) for name, x in arrays.items()}


def batch_logits(model: LM, batch: dict[str, jax.Array]) -> Float[Array, "B T V"]:
    """The model's logits for a device batch (the one place the steps call the model): packed documents stay
    apart (segment_ids: no mixer reads across a document boundary, RoPE restarts per document)."""
    return model(batch["inputs"], segment_ids=batch.get("segment_ids"))


def token_scores(
    logits_BTV: Float[Array, "B T V"], targets_BT: Int[Array, "B T"]
) -> tuple[Float[Array, "B T"], Bool[Array, "B T"], Bool[Array, "B T"]]:
    """Per token: (the nll of its target in float32, 0 where IGNORE; whether the argmax is its target, False where
    IGNORE; whether it is labelled: targets != IGNORE). Scores of consecutive pieces of a sequence, concatenated
    along T, are the whole sequence's (a decode eval's steps: experiments/compare/evaluate.py)."""
    mask_BT = targets_BT != IGNORE
    logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    safe_BT = jnp.where(mask_BT, targets_BT, 0)
    nll_BT = -jnp.take_along_axis(logp_BTV, safe_BT[..., None], axis=-1)[..., 0]
    correct_BT = (jnp.argmax(logits_BTV, axis=-1) == targets_BT) & mask_BT
    return jnp.where(mask_BT, nll_BT, 0.0), correct_BT, mask_BT


def masked_sums(logits_BTV: Float[Array, "B T V"], targets_BT: Int[Array, "B T"]) -> dict[str, Float[Array, "..."]]:
    """Sums over the labelled positions (targets != IGNORE): nll, correct argmax, labels; over the rows with a
    label: exact (every label right) and rows; and at each position, over the rows: nll_T and labels_T [T]."""
    return score_sums(*token_scores(logits_BTV, targets_BT))


def score_sums(
    nll_BT: Float[Array, "B T"], correct_BT: Bool[Array, "B T"], mask_BT: Bool[Array, "B T"]
) -> dict[str, Float[Array, "..."]]:
    """`masked_sums`' sums from `token_scores` (of one forward, or of a sequence's pieces concatenated along T)."""
    has_label_B = jnp.any(mask_BT, axis=1)
    exact_B = jnp.all(correct_BT | ~mask_BT, axis=1) & has_label_B
    f32 = lambda x: jnp.sum(x, dtype=jnp.float32)
    return {
        "nll": f32(nll_BT),
        "correct": f32(correct_BT),
        "labels": f32(mask_BT),
        "exact": f32(exact_B),
        "rows": f32(has_label_B),
        "nll_T": jnp.sum(nll_BT, axis=0, dtype=jnp.float32),
        "labels_T": jnp.sum(mask_BT, axis=0, dtype=jnp.float32),
    }


SCALAR_SUMS = ("nll", "correct", "labels", "exact", "rows")


def ratios(sums: dict) -> dict[str, float]:
    """loss, accuracy and exact_match from (summed) `masked_sums` (fetched from the devices)."""
    sums = {k: float(v) for k, v in jax.device_get(sums).items() if k in SCALAR_SUMS}
    labels, rows = max(sums["labels"], 1.0), max(sums["rows"], 1.0)
    return {
        "loss": sums["nll"] / labels,
        "accuracy": sums["correct"] / labels,
        "exact_match": sums["exact"] / rows,
    }


def make_init(lm: LMConfig, tx: optax.GradientTransformation, seed: int):
    """A function init(params=None) making the train state {params, opt_state, step} from `params` (a model's
    state: a run from an existing model) or, None, of LM(lm) with nnx.Rngs(seed): jit it with out_shardings to
    make a sharded state in place, or jax.eval_shape it for the shapes."""

    def init(params=None):
        if params is None:
            params = nnx.state(LM(lm, rngs=nnx.Rngs(seed)))
        return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}

    return init


def under_mesh(fn, mesh: Mesh | None, rules=DEFAULT_RULES):
    """`fn` called, and so traced, under `jax.set_mesh(mesh)` and the logical-axis `rules`
    (`nnx.logical_axis_rules`): the model's mixers see the mesh (its "sequence" axis switches them to the
    context-parallel ops) and its activations' logical axes resolve against it. None: `fn`."""
    if mesh is None:
        return fn

    @functools.wraps(fn)
    def call(*args):
        with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
            return fn(*args)

    def lower(*args):
        with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
            return fn.lower(*args)

    call.lower = lower  # ahead-of-time compilation, traced under the mesh too
    return call


def make_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    traces: TraceCount,
    *,
    mesh: Mesh | None = None,
    state_shardings=None,
    batch_sharding: NamedSharding | None = None,
    rules=DEFAULT_RULES,
    distill: Distill | None = None,
    teacher_shardings=None,
):
    """jit(state, batch) -> (new state, {loss, accuracy, grad_norm}); state donated; batch from `device_batch`.

    With `distill` the step is jit(state, batch, teacher parameters): the loss adds distill.kl_weight times the
    mean KL(teacher || student) over the labelled positions (`kl_sum`) and distill.layer_weight times the layer
    term (`teacher_pass`), the teacher's forward running inside the step; the metrics add ce (the
    cross-entropy), kl and layer_mse.

    With a mesh (retention/parallel): the step runs under it and the logical-axis `rules`, the state stays in
    `state_shardings` (in and out), the batch comes in `batch_sharding` (and the teacher's parameters in
    `teacher_shardings`); XLA inserts the collectives. The model code is the same.
    """

    def train_step(state, batch, teacher=None):
        traces.count += 1

        def loss_fn(params):
            model = nnx.merge(graphdef, params)
            logits = batch_logits(model, batch)
            sums = masked_sums(logits, batch["targets"])
            labels = jnp.maximum(sums["labels"], 1.0)
            ce = sums["nll"] / labels
            if distill is None:
                return ce, (sums, {})
            layers = distill.layers if distill.layer_weight else ()
            teacher_logits, mse = teacher_pass(nnx.merge(distill.teacher, teacher), model, batch, layers)
            mask = batch["targets"] != IGNORE
            kl = kl_sum(teacher_logits, logits, mask, distill.temperature) / labels
            loss = ce + distill.kl_weight * kl + distill.layer_weight * mse
            return loss, (sums, {"ce": ce, "kl": kl, "layer_mse": jnp.asarray(mse, jnp.float32)})

        (loss, (sums, terms)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {
            "loss": loss,
            "accuracy": sums["correct"] / jnp.maximum(sums["labels"], 1.0),
            "grad_norm": optax.tree.norm(grads),
            **terms,
        }
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    if mesh is None:
        return jax.jit(train_step, donate_argnums=0)
    shardings = (state_shardings, batch_sharding) + ((teacher_shardings,) if distill is not None else ())
    return under_mesh(
        jax.jit(train_step, donate_argnums=0, in_shardings=shardings, out_shardings=(state_shardings, None)),
        mesh,
        rules,
    )


def make_eval_step(graphdef: nnx.GraphDef, *, mesh: Mesh | None = None, rules=DEFAULT_RULES):
    """jit(params, batch) -> masked_sums of the forward (compiled once per length); under `mesh` and `rules` when
    given (the inputs' shardings are kept)."""
    return under_mesh(
        jax.jit(lambda params, batch: masked_sums(batch_logits(nnx.merge(graphdef, params), batch), batch["targets"])),
        mesh,
        rules,
    )
