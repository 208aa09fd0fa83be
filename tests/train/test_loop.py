"""The loop in-process: a short run lowers the loss, compiles its train step once (timed apart from the steps),
never copies from the devices implicitly (the steps queue up between log points), logs to TensorBoard and writes
its summary; a non-finite loss stops the run and leaves the last good checkpoint."""

import json
import os

import jax
import numpy as np
import pytest

from retention.checksum import tree_checksums
from retention.train import NonFiniteLoss, train
from tests.train.common import TINY, compose_config, event_files, event_tags, saved_state, saved_steps


@pytest.mark.integration
def test_short_run_lowers_loss_and_compiles_once(tmp_path):
    """Seed 11, not a fresh one: initial_loss is one batch of 4 x 16 tokens, so "0.3 below it after 40 steps" is
    noise-bound (seed 122269946 starts at 2.57, under chance ln 24 = 3.18, and ends at 2.98)."""
    cfg = compose_config([*TINY, "trainer.steps=40", "trainer.ckpt_every=100", "trainer.log_every=8", "seed=11"])
    with jax.transfer_guard_device_to_host("disallow"):  # float() of a step's metrics would raise
        summary = train(cfg, str(tmp_path))
    assert summary["train_traces"] == 1  # one compilation for all 40 steps: a retrace is an error
    assert summary["compile_s"] > 0 and summary["tokens_per_s"] > 0
    assert summary["train_loss"] < summary["initial_loss"] - 0.3, summary
    assert set(summary["eval"]) == {"16", "32"} and np.isfinite(summary["final_loss"])
    assert summary["eval_lengths"] == {"x1": 16, "x2": 32} and summary["tokens_seen"] == 40 * 4 * 16
    assert summary["cache_bytes"]["1024"] > summary["cache_bytes"]["16"]  # the A layer's KV cache grows
    assert json.load(open(tmp_path / "summary.json")) == summary
    assert saved_steps(tmp_path) == [40]  # only the end: 40 < ckpt_every
    assert [os.path.dirname(f) for f in event_files(tmp_path / "tb")] == [str(tmp_path / "tb")]  # one TB run
    tags = event_tags(tmp_path / "tb")
    assert {"perf/compile_s", "perf/tokens_per_s", "train/loss", "train/tokens_seen", "eval/x2/accuracy"} <= tags


@pytest.mark.integration
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
    steps = saved_steps(tmp_path)
    assert steps and max(steps) < 50 and not (tmp_path / "summary.json").exists()
    for step in steps:  # every checkpoint left is a good one
        assert tree_checksums(saved_state(tmp_path, step))[1], step
