"""The loop in-process: a short run lowers the loss, compiles its train step once, logs to TensorBoard and
writes its summary; a non-finite loss stops the run and leaves the last good checkpoint."""

import json
import os

import numpy as np
import orbax.checkpoint as ocp
import pytest

from retention.train import NonFiniteLoss, train
from retention.train.checkpoint import all_finite
from tests.train.common import TINY, compose_config


def test_short_run_lowers_loss_and_compiles_once(tmp_path):
    seed = int(np.random.SeedSequence().generate_state(1)[0] % 2**31)
    cfg = compose_config([*TINY, "trainer.steps=40", "trainer.ckpt_every=100", f"seed={seed}"])
    summary = train(cfg, str(tmp_path))
    assert summary["train_traces"] == 1  # one compilation for all 40 steps: a retrace is an error
    assert summary["train_loss"] < summary["initial_loss"] - 0.3, summary
    assert set(summary["eval"]) == {"16", "32"} and np.isfinite(summary["final_loss"])
    assert summary["cache_bytes"]["1024"] > summary["cache_bytes"]["16"]  # the A layer's KV cache grows
    assert json.load(open(tmp_path / "summary.json")) == summary
    assert os.listdir(tmp_path / "checkpoints") == ["40"]  # only the end: 40 < ckpt_every
    events = [f for root, _, fs in os.walk(tmp_path / "tb") for f in fs if f.startswith("events")]
    assert len(events) >= 2  # the scalars and the hparams summary


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    """A learning rate of 1e30 blows the weights up within a few steps: the run stops with NonFiniteLoss and
    the checkpoints on disk are the finite ones written before."""
    cfg = compose_config(
        [
            *TINY,
            "trainer.steps=50",
            "trainer.ckpt_every=1",
            "trainer.keep=50",
            "optim.lr=1e30",
            "optim.clip_norm=1e30",
            "trainer.eval_scales=[1]",
        ]
    )
    with pytest.raises(NonFiniteLoss, match="last good checkpoint is step"):
        train(cfg, str(tmp_path))
    steps = sorted(int(n) for n in os.listdir(tmp_path / "checkpoints") if n.isdigit())
    assert steps and max(steps) < 50 and not (tmp_path / "summary.json").exists()
    for step in steps:  # every checkpoint left is a good one
        state = ocp.StandardCheckpointer().restore(str(tmp_path / "checkpoints" / str(step) / "default"))
        assert all_finite(state), step
