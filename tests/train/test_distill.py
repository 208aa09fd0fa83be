"""The distillation train step and frozen parameters, on a tiny softmax LM converted to PA: with both weights 0
the step is the plain step bit for bit; the KL term equals a float64 KL computed by hand; the layer term equals
the MSE of the converted mixer against the attention it replaced, recomputed outside the step; a converted model
trains and its losses fall over a few steps while frozen parameters never change."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention.data import IGNORE
from retention.nn import LM, LMConfig, convert
from retention.train.config import OptimConfig
from retention.train.distill import Distill, kl_sum, teacher_pass
from retention.train.init_from import ALL_BUT_CONVERTED, freeze, frozen_labels, param_name
from retention.train.optimizer import make_optimizer
from retention.train.step import TraceCount, make_init, make_train_step

SOURCE = LMConfig(vocab_size=32, d_model=32, n_layers=2, pattern="A", n_heads=4, n_kv_heads=2, head_dim=8)


@pytest.fixture(scope="module")
def models():
    """(the teacher: a random softmax LM, the student: it converted to PA, a batch with some unlabelled targets)."""
    teacher = LM(SOURCE, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, SOURCE.vocab_size, (2, 13))
    targets = tokens[:, 1:].copy()
    targets[:, :3] = IGNORE
    batch = {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32), "targets": jnp.asarray(targets, jnp.int32)}
    return teacher, convert(teacher, "PA"), batch


def run_steps(student, batch, n, *, distill=None, teacher=None, labels=None):
    """(the params after n steps on `batch`, each step's metrics) of AdamW at lr 1e-2 from `student`."""
    tx = make_optimizer(OptimConfig(lr=1e-2, warmup_steps=1), 10)[0]
    tx = tx if labels is None else freeze(tx, labels)
    graphdef, params = nnx.split(student)
    step = make_train_step(graphdef, tx, TraceCount(), distill=distill)
    state = jax.jit(make_init(student.config, tx, 0))(params)
    extra = () if teacher is None else (nnx.state(teacher),)
    metrics = []
    for _ in range(n):
        state, m = step(state, batch, *extra)
        metrics.append(jax.device_get(m))
    return state["params"], metrics


def test_zero_weights_give_the_plain_step(models):
    teacher, student, batch = models
    plain, plain_metrics = run_steps(student, batch, 2)
    distill = Distill(0.0, 2.0, 0.0, nnx.graphdef(teacher), (0,))
    got, metrics = run_steps(student, batch, 2, distill=distill, teacher=teacher)
    jax.tree.map(np.testing.assert_array_equal, got, plain)
    assert [m["loss"] for m in metrics] == [m["loss"] for m in plain_metrics]
    assert metrics[0]["kl"] > 0 and metrics[0]["ce"] == metrics[0]["loss"]


def test_kl_against_a_float64_kl():
    rng = np.random.default_rng(1)
    t, s = rng.normal(size=(2, 5, 7)) * 3, rng.normal(size=(2, 5, 7)) * 3
    mask = rng.random((2, 5)) < 0.6
    tau = 2.0
    p = np.exp(t / tau) / np.exp(t / tau).sum(-1, keepdims=True)
    q = np.exp(s / tau) / np.exp(s / tau).sum(-1, keepdims=True)
    want = tau**2 * (p * (np.log(p) - np.log(q))).sum(-1)[mask].sum()
    got = kl_sum(jnp.asarray(t, jnp.float32), jnp.asarray(s, jnp.float32), jnp.asarray(mask), tau)
    np.testing.assert_allclose(float(got), want, rtol=2e-6)


def test_layer_term_and_teacher_logits(models):
    teacher, student, batch = models
    logits, mse = jax.jit(functools.partial(teacher_pass, layers=(0,)))(teacher, student, batch)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(teacher(batch["inputs"])), rtol=1e-5, atol=1e-5)
    h = teacher.blocks[0].mixer_norm(teacher.embed(batch["inputs"]))  # layer 0's input: the embeddings, normed
    positions = jnp.arange(batch["inputs"].shape[1])
    want = np.mean(
        (
            np.asarray(student.blocks[0].mixer(h, positions=positions), np.float64)
            - np.asarray(teacher.blocks[0].mixer(h, positions=positions), np.float64)
        )
        ** 2
    )
    assert want > 0
    np.testing.assert_allclose(float(mse), want, rtol=1e-4)


def test_converted_model_trains_and_frozen_parameters_hold(models):
    teacher, student, batch = models
    before = nnx.state(student)
    labels = frozen_labels(before, ["blocks.0.mixer.k_proj.*", ALL_BUT_CONVERTED], (0,))
    distill = Distill(1.0, 1.0, 100.0, nnx.graphdef(teacher), (0,))  # the layer term leads
    after, metrics = run_steps(student, batch, 6, distill=distill, teacher=teacher, labels=labels)
    for key in ("loss", "ce", "kl", "layer_mse"):
        values = [float(m[key]) for m in metrics]
        assert all(np.isfinite(values)) and (key in ("ce", "kl") or values[-1] < values[0]), (key, values)
    names = [param_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(before)]
    frozen = jax.tree.leaves(labels)
    trained = {n for n, label in zip(names, frozen) if label == "train"}
    assert trained == {n for n in names if n.startswith("blocks.0.mixer.") and ".k_proj." not in n} != set()
    for name, label, x, y in zip(names, frozen, jax.tree.leaves(before), jax.tree.leaves(after)):
        if label == "frozen":
            np.testing.assert_array_equal(np.asarray(y), np.asarray(x), err_msg=name)
        else:
            assert not np.array_equal(np.asarray(y), np.asarray(x)), name


def test_a_glob_that_matches_nothing_is_refused(models):
    with pytest.raises(ValueError, match=r"freeze: 'blocks.9.\*' matches no parameter"):
        frozen_labels(nnx.state(models[1]), ["blocks.9.*"], ())
