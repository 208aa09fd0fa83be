"""Gradient accumulation (optim.accumulate = N, optax.MultiSteps) against its oracle: N micro-batches of B rows make
the optimizer step that one batch of their N * B rows makes with accumulate = 1, to float32 accuracy, over steps
through the warmup and the cosine decay (trainer.steps and warmup_steps count micro-batches, so the oracle run has
N times fewer of both); the parameters hold between the N micro-steps, and the logged rate of each micro-step is
the rate its optimizer step takes; a run checkpointed between the micro-steps of an optimizer step resumes to the
parameters of the uninterrupted run, bit for bit (the checkpoint holds the gradients accumulated so far)."""

import dataclasses
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention.nn import LM, LMConfig
from retention.train import train as train_run
from retention.train.config import OptimConfig, TrainerConfig, check_optim_trainer
from retention.train.optimizer import make_optimizer
from retention.train.step import TraceCount, make_init, make_train_step
from tests.train.common import TINY, compose_config, fresh_seed, saved_state, saved_steps

CONFIG = LMConfig(vocab_size=32, d_model=16, n_layers=2, pattern="PA", n_heads=2, n_kv_heads=2, head_dim=8)
N, B, T, STEPS = 4, 2, 16, 3  # accumulate, micro-batch rows, tokens, optimizer steps
OPTIM = OptimConfig(lr=1e-2, warmup_steps=1, min_lr_ratio=0.1)  # the oracle's: a step's warmup, then the decay


def batches(seed: int) -> list[dict]:
    """STEPS batches of N * B rows of random tokens, every target labelled (each micro-batch as many labels)."""
    tokens = np.random.default_rng(seed).integers(0, CONFIG.vocab_size, (STEPS, N * B, T + 1))
    return [{"inputs": jnp.asarray(t[:, :-1], jnp.int32), "targets": jnp.asarray(t[:, 1:], jnp.int32)} for t in tokens]


def train(optim: OptimConfig, steps: int, feed: list[dict]) -> list:
    """The parameters after each batch of `feed`, from the same initial model (seed 0)."""
    tx, _ = make_optimizer(optim, steps)
    graphdef, params = nnx.split(LM(CONFIG, rngs=nnx.Rngs(0)))
    step = make_train_step(graphdef, tx, TraceCount())
    state = jax.jit(make_init(CONFIG, tx, 0))(params)
    out = []
    for batch in feed:
        state, _ = step(state, batch)
        out.append(jax.device_get(state["params"]))
    return out


def test_n_micro_batches_make_the_step_of_one_batch_n_times_larger():
    big = batches(0)
    micro = [{k: v[i * B : (i + 1) * B] for k, v in batch.items()} for batch in big for i in range(N)]
    accumulating = dataclasses.replace(OPTIM, accumulate=N, warmup_steps=OPTIM.warmup_steps * N)
    want = train(OPTIM, STEPS, big)
    got = train(accumulating, STEPS * N, micro)
    initial = jax.device_get(nnx.state(LM(CONFIG, rngs=nnx.Rngs(0))))
    for k in range(STEPS):
        before = initial if k == 0 else got[k * N - 1]
        for i in range(N - 1):  # between optimizer steps the parameters hold
            jax.tree.map(np.testing.assert_array_equal, got[k * N + i], before)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), got[k * N + N - 1], want[k])
    moved = [
        max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(initial))) for w in want
    ]
    assert moved[-1] > 100 * 2e-6, moved  # the steps moved the parameters far past the tolerance


def test_each_micro_step_logs_the_rate_of_its_optimizer_step():
    _, oracle = make_optimizer(OPTIM, STEPS)
    _, schedule = make_optimizer(dataclasses.replace(OPTIM, accumulate=N, warmup_steps=N), STEPS * N)
    got = [float(schedule(step)) for step in range(STEPS * N)]
    assert got == [float(oracle(step // N)) for step in range(STEPS * N)]
    assert len(set(got)) == STEPS  # warmup (0), peak, decay: three rates


@pytest.mark.parametrize("accumulate", [0, -2, 1.5, True])
def test_accumulate_below_one_or_not_an_int_is_refused(accumulate):
    with pytest.raises(ValueError, match=rf"optim.accumulate must be an int >= 1, got {accumulate!r}"):
        check_optim_trainer(OptimConfig(accumulate=accumulate), TrainerConfig())


@pytest.mark.integration
def test_a_run_resumed_between_micro_steps_ends_as_the_uninterrupted_run(tmp_path):
    overrides = [*TINY, "optim.accumulate=2", "optim.warmup_steps=0", "trainer.steps=6", "trainer.ckpt_every=1"]
    overrides += ["trainer.keep=10", "trainer.eval_scales=[1]", f"seed={fresh_seed()}"]
    whole = tmp_path / "whole"
    train_run(compose_config(overrides), str(whole))
    params = {s: jax.tree.leaves(saved_state(whole, s)["params"]) for s in saved_steps(whole)}
    assert sorted(params) == [1, 2, 3, 4, 5, 6]
    for s in (3, 5):  # micro-steps 3 and 5 begin an optimizer step: the parameters hold
        jax.tree.map(np.testing.assert_array_equal, params[s], params[s - 1])
    for s in (2, 4, 6):  # micro-steps 2, 4 and 6 end one: the parameters move
        assert any(np.any(a != b) for a, b in zip(params[s], params[s - 1])), s
    cut = shutil.copytree(whole, tmp_path / "cut")
    for s in (4, 5, 6):
        shutil.rmtree(cut / "checkpoints" / str(s))
    resumed = train_run(compose_config(overrides), str(cut))  # one micro-batch's gradients held at micro-step 3
    assert resumed["resumed_from"] == 3
    jax.tree.map(np.testing.assert_array_equal, jax.tree.leaves(saved_state(cut, 6)["params"]), params[6])
