"""Out of a run: load_run gives the trained parameters (checked against their checksums) and the run's config;
greedy generation from it equals the argmax of the trained model's full forward; an export (safetensors and
JSON) reads back bit for bit."""

import json
import logging
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention import LM, generate, load_run
from retention.export import main as export_main
from retention.load import read_run
from tests.nn.test_generate import greedy_by_full_forward
from tests.train.common import compose_config
from tests.train.test_checkpoint import _truncate_data, assert_same_params


def test_load_run_then_greedy_generate(finished_run):
    model, cfg, tokenizer = load_run(str(finished_run.folder))
    assert isinstance(model, LM) and cfg == compose_config(finished_run.overrides) and tokenizer is None  # MQAR
    assert_same_params(nnx.state(model), finished_run.params[4])  # the last step's, read by Orbax alone
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 5)), jnp.int32)
    out = generate(model, prompt, 6, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(greedy_by_full_forward(model, prompt, 6)))


def test_load_run_picks_a_step_and_skips_a_damaged_one(finished_run, tmp_path, caplog):
    run = finished_run.copy(tmp_path / "run")
    assert_same_params(nnx.state(load_run(str(run), step=2)[0]), finished_run.params[2])
    with pytest.raises(ValueError, match=r"step must be None or one of the checkpoints \[1, 2, 3, 4\]"):
        load_run(str(run), step=7)
    _truncate_data(run / "checkpoints" / "4")
    caplog.set_level(logging.WARNING)
    loaded = read_run(str(run))
    assert loaded.step == 3 and "skipping checkpoint 4" in caplog.text
    assert os.path.isdir(run / "checkpoints" / "4")  # read-only: nothing moved
    with pytest.raises(ValueError):
        load_run(str(run), step=4)


def test_export_then_load_round_trips(finished_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["export", str(finished_run.folder), str(tmp_path / "out"), "--step", "3"])
    export_main()
    assert (tmp_path / "out" / "model.safetensors").is_file() and "wrote" in capsys.readouterr().out
    exported, cfg, tokenizer = load_run(str(tmp_path / "out"))
    assert cfg == compose_config(finished_run.overrides) and tokenizer is None
    config = json.load(open(tmp_path / "out" / "config.json"))  # the built model's sizes, the run's pattern
    lm = exported.config
    assert config["architectures"] == ["RetentionLM"] and config["layer_pattern"] == lm.pattern == "PA"
    assert (config["hidden_size"], config["intermediate_size"]) == (lm.d_model, lm.mlp_hidden)
    assert config["layer_mixers"] == ["power retention", "full attention"]
    assert_same_params(nnx.state(exported), finished_run.params[3])  # bit for bit, dtypes too
    for got, want in zip(jax.tree.leaves(nnx.state(exported)), jax.tree.leaves(finished_run.params[3])):
        assert got.dtype == want.dtype
