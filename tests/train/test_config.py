"""Configs: the presets compose and have equal parameter counts; a misspelt key or a wrong type stops at
composition; a bad value raises ValueError naming its key, the value and what is allowed."""

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from retention.nn import count_params
from retention.train import build
from tests.train.common import TINY, compose_config


def test_presets_have_equal_parameter_counts():
    counts = {}
    for preset in ("softmax", "swa", "power", "hybrid"):
        lm, _ = build(compose_config([f"model={preset}"]))
        assert lm.layer_kinds.startswith({"softmax": "A", "swa": "W", "power": "P", "hybrid": "PPPA"}[preset])
        counts[preset] = count_params(lm)
    assert max(counts.values()) / min(counts.values()) < 1.03, counts


@pytest.mark.parametrize("task", ["mqar", "passkey", "copy", "text"])
def test_data_presets_build(task, tmp_path):
    (tmp_path / "a.txt").write_text("hello " * 40000)
    lm, data = build(compose_config([f"data={task}", f"data.path={tmp_path}"]))
    batch = data.batch(0)
    assert batch.inputs.shape == (data.batch_size, data.seq_len) and lm.vocab_size == data.vocab_size


@pytest.mark.parametrize("override", ["model.n_layer=2", "data.seqlen=64", "optim.learning_rate=0.1", "foo=1"])
def test_misspelt_key_stops_at_start(override):
    with pytest.raises((ConfigCompositionException, ConfigKeyError)) as info:
        compose_config([override])
    assert override.split("=")[0].split(".")[-1] in str(info.value) + str(info.value.__cause__)


@pytest.mark.parametrize("override", ["data.seq_len=long", "trainer.steps=1.5", "model.gating=maybe"])
def test_wrong_type_stops_at_start(override):
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_config([override])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.seq_len=63"], "data.seq_len must be even"),
        (["data.vocab_size=64", "data.seq_len=64"], "data.vocab_size must be > seq_len=64"),
        (["data.num_kv_pairs=20"], "data.seq_len must be even and >= 4 \\* num_kv_pairs = 80, got 64"),
        (["data.task=lm"], "data.task must be one of \\('mqar', 'passkey', 'copy', 'text'\\), got 'lm'"),
        (["data=passkey", "trainer.eval_scales=[1,0]"], "trainer.eval_scales\\[i\\] must be an int >= 1, got 0"),
        (["data=copy", "data.num_copy=80"], "data.seq_len must be >= 2 \\* num_copy = 160, got 128"),
        (["model.n_heads=3"], "model.n_heads must be a multiple of n_kv_heads"),
        (["model.pattern=PXA"], "model.pattern must be a non-empty string over the letters"),
        (["model.dtype=fp8"], "model.dtype must be one of"),
        (["optim.warmup_steps=2000"], "optim.warmup_steps must be in \\[0, trainer.steps=1000\\), got 2000"),
        (["optim.lr=0"], "optim.lr must be > 0, got 0"),
        (["trainer.ckpt_every=0"], "trainer.ckpt_every must be an int >= 1, got 0"),
        (["data=passkey", "data.depths=[0.5,1.5]"], "data.depths\\[i\\] must be in \\[0, 1\\], got 1.5"),
    ],
)
def test_bad_value_names_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        build(compose_config(overrides))


def test_tiny_config_builds():
    lm, data = build(compose_config(TINY))
    assert lm.layer_kinds == "PA" and data.seq_len == 16
