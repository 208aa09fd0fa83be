"""The trainer from an existing model: the shared tiny PA run, fine-tuned as PP (init_from=run:DIR, init_convert,
the new gate's bias from model.gate_bias_init, every parameter outside the converted mixer frozen, KL and layer
distillation), gives a run whose record and checkpoint state the converted model (load_run round-trips it), whose frozen
parameters are the source's bit for bit and whose distillation terms are logged; bad settings stop before any
work, naming the key."""

import jax
import numpy as np
import pytest
from flax import nnx

from retention import load_run
from retention.train import train
from retention.train.init_from import param_name
from tests.train.common import TINY, compose_config, event_tags

BASE = [o for o in TINY if not o.startswith("model")] + ["trainer.eval_scales=[1]", "trainer.steps=2"]


def fine_tune(finished_run, *more):
    """Overrides of a run from the shared finished PA run (tests/train/conftest.py)."""
    return [*BASE, "model=source", f"init_from=run:{finished_run.folder}", *more]


def test_fine_tune_a_converted_run(finished_run, tmp_path):
    overrides = fine_tune(
        finished_run,
        "init_convert=P",
        "model.gate_bias_init=6.0",
        "freeze=[all_but_converted]",
        "distill.kl_weight=1.0",
        "distill.layer_weight=1.0",
        "distill.temperature=2.0",
    )
    summary = train(compose_config(overrides), str(tmp_path / "ft"))
    assert summary["layer_kinds"] == "PP" and np.isfinite(summary["final_loss"])
    assert {"train/ce", "train/kl", "train/layer_mse"} <= event_tags(tmp_path / "ft" / "tb")
    teacher = load_run(str(finished_run.folder)).model
    model, cfg, _ = load_run(str(tmp_path / "ft"))
    assert cfg.init_convert == "P" and cfg.distill.layer_weight == 1.0
    assert (model.config.pattern, model.config.conv_size, model.config.d_model) == ("P", 4, 16)
    old = {param_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(nnx.state(teacher))}
    changed = set()
    for path, x in jax.tree_util.tree_leaves_with_path(nnx.state(model)):
        name = param_name(path)
        if name.startswith("blocks.1.mixer.gate_proj."):  # the new gate: kernel 0 and bias 6, then 1 step at 1e-2
            assert name not in old
            np.testing.assert_allclose(np.asarray(x), 6.0 if name.endswith("bias") else 0.0, atol=0.05)
        elif not name.startswith("blocks.1.mixer."):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(old[name]), err_msg=name)
        elif name in old and not np.array_equal(np.asarray(x), np.asarray(old[name])):
            changed.add(name)
    assert "blocks.1.mixer.q_proj.kernel" in changed  # the converted mixer trained


@pytest.mark.parametrize(
    "more, match",
    [
        (["model.d_model=32"], r"model.d_model=32 contradicts the source 'run:.*', whose d_model is 16"),
        (["model.pattern=P"], r"model.pattern='P' contradicts the source"),
        (["model.gate_bias_init=6"], r"model.gate_bias_init=6.0 contradicts .* may set only \['dtype'"),
        (["data.vocab_size=30"], r"the data's vocabulary \(30 ids\) must be the source's: .* vocab_size=24"),
        (["init_convert=PM"], r"init_convert='PM': 'M' \(Mamba2\) cannot reuse"),
        (["init_convert=P", "model.deg=4"], r"init_convert='P': mixer setting deg=4: the model's \['P'\] layers"),
        (["freeze=[nothing.*]"], r"freeze: 'nothing.\*' matches no parameter"),
        (["freeze=[all_but_converted]"], r"names 'all_but_converted': set init_convert"),
        (["distill.kl_weight=-1"], r"distill.kl_weight must be .*-1"),
        (["distill.temperature=0"], r"distill.temperature must be"),
        (["distill.layer_weight=1"], r"distill.layer_weight=1.0 compares converted layers .* set init_convert"),
        (["init_from=hub:x"], r"init_from must be <source>:<folder> with a source of \['hf', 'run'\], got 'hub:x'"),
    ],
)
def test_bad_settings_are_refused(finished_run, tmp_path, more, match):
    with pytest.raises(ValueError, match=match):
        train(compose_config(fine_tune(finished_run, *more)), str(tmp_path / "ft"))


def test_conversion_and_distillation_need_init_from(tmp_path):
    for more, match in [
        ("init_convert=PA", r"init_convert='PA' converts an existing model: set init_from"),
        ("model=source", r"model=source takes its model from init_from"),
        ("distill.kl_weight=1", r"distill.kl_weight=1.0 / .* distil from the init_from model"),
    ]:
        overrides = [o for o in TINY if not (more.startswith("model=") and o.startswith("model="))]
        with pytest.raises(ValueError, match=match):
            train(compose_config([*overrides, more]), str(tmp_path / "x"))
