"""TensorBoard compares a sweep: `train.py -m` with 20+ overrides runs in short folders (<job>_<model>); each run
is one TensorBoard run with train/tokens_seen, tokens-indexed twins and eval tags relative to its training length
(eval/x1/loss in a run at 16 tokens and in one at 32); its HParams row (written at the start) holds the keys that
identify it, the swept key and the absolute eval lengths, with eval values, tokens/s and cache bytes as metrics."""

import dataclasses
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from retention.nn import LMConfig
from retention.train.hparams import architecture_hparams
from tests.train.common import ROOT, TINY, event_files, event_tags


def hparams_of(logdir) -> tuple[dict, list[str]]:
    """(the run's HParams values, the metric tags its experiment lists), from its event file."""
    events = EventAccumulator(str(logdir))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    values = {
        k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
        for k, v in start.session_start_info.hparams.items()
    }
    return values, [m.name.tag for m in experiment.experiment.metric_infos]


@pytest.mark.integration
def test_a_sweep_shares_tags_and_has_one_row_per_run(tmp_path):
    overrides = [*TINY, "trainer.steps=3", "trainer.ckpt_every=3", "data.vocab_size=40", "data.seq_len=16,32"]
    assert len(overrides) > 13  # hydra.job.override_dirname would be a file name too long
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "train.py", "-m", f"hydra.sweep.dir={tmp_path}", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted(d for d in os.listdir(tmp_path) if os.path.isdir(tmp_path / d) and not d.startswith("."))
    assert runs == ["0_hybrid", "1_hybrid"], runs
    for run, seq_len in zip(runs, (16, 32)):
        logdir = tmp_path / run / "tb"
        assert [os.path.dirname(f) for f in event_files(tmp_path / run)] == [str(logdir)]  # one TensorBoard run
        tags = event_tags(logdir)
        assert {"train/tokens_seen", "vs_tokens/train/loss", "eval/x1/loss", "eval/x2/accuracy"} <= tags
        assert not any(t.startswith(f"eval_{seq_len}") for t in tags)
        values, metrics = hparams_of(logdir)
        assert values["data.seq_len"] == seq_len and values["eval_len.x2"] == 2 * seq_len
        for key in ("model.name", "model.pattern", "params", "model.deg", "model.head_dim", "optim.lr", "seed"):
            assert key in values, key
        assert values["model"] == "hybrid" and values["trainer.steps"] == 3  # what the command line set
        assert {"eval/x1/loss", "eval/x2/accuracy", "perf/tokens_per_s", "model/cache_bytes/1024"} <= set(metrics)
        assert {"perf/tokens_per_s", "model/cache_bytes/1024"} <= tags  # the metrics' values are scalars


def test_hparams_hold_every_architecture_field():
    """Each LMConfig field is an HParams key `model.<field>` with the run's value (None as "none"), and each
    per-layer setting `model.layers.<letter>.<field>`: a sweep over conv_size, qk_norm, gating or P's RoPE is told
    apart in the HParams tab."""
    lm = LMConfig(pattern="PA", n_layers=2, conv_size=3, qk_norm=True, gating=False, deg=4, head_dim=16, window=7)
    lm = dataclasses.replace(lm, layers={"P": {"rope_base": None, "deg": 2}, "A": {"window": 3}})
    values = architecture_hparams(lm)
    fields = {f.name for f in dataclasses.fields(LMConfig)} - {"vocab_size", "layers"}
    layers = {"model.layers.P.rope_base", "model.layers.P.deg", "model.layers.A.window"}  # each per-layer setting
    assert set(values) == {f"model.{name}" for name in fields} | layers
    assert values["model.layers.P.rope_base"] == "none" and values["model.layers.P.deg"] == 2
    assert values["model.conv_size"] == 3 and values["model.qk_norm"] is True and values["model.gating"] is False
    assert values["model.deg"] == 4 and values["model.head_dim"] == 16 and values["model.window"] == 7
    assert values["model.chunk_size"] == "none" and values["model.kv_cache_bits"] == "none"
