"""The trainer with scanned layers and a remat policy: two steps train and checkpoint the stacked parameters, and
load_run converts them to the unscanned form, which gives the scanned model's logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention import load_run
from retention.train import train
from tests.helpers import rel_err
from tests.train.common import TINY, compose_config, fresh_seed, saved_state


@pytest.mark.integration
def test_two_scanned_steps_with_remat_then_load_unscanned(tmp_path):
    overrides = [
        *TINY,
        "model.scan_layers=true",
        "model.remat_policy=save_projections",
        "trainer.steps=2",
        "trainer.ckpt_every=2",
        "trainer.eval_scales=[1]",
        f"seed={fresh_seed()}",
    ]
    summary = train(compose_config(overrides), str(tmp_path))
    assert summary["train_traces"] == 1 and np.isfinite(summary["train_loss"]), summary
    stacked = saved_state(tmp_path, 2)["params"]["periods"]["blocks"]["0"]["mixer"]["q_proj"]["kernel"]
    assert stacked["value"].shape[0] == 1  # TINY: pattern PA over 2 layers is one repeat of the period
    scanned = load_run(str(tmp_path)).model
    unscanned, cfg, _ = load_run(str(tmp_path), scan_layers=False)
    assert scanned.config.scan_layers and not unscanned.config.scan_layers and cfg.model.scan_layers
    tokens = jax.random.randint(jax.random.key(fresh_seed()), (2, 16), 0, scanned.config.vocab_size, jnp.int32)
    forward = nnx.jit(lambda m, t: m(t))
    assert rel_err(forward(unscanned, tokens), forward(scanned, tokens)) < 2e-6
