"""Import refuses what it cannot honour, naming it: a config field that changes the computation in a way the LM
does not (another activation, biases Llama's layers do not have, sliding-window layers of Qwen, a RoPE scaling
other than linear and llama3, in rope_parameters or a rope_scaling beside it, a field it does not know), an unknown
architecture, a missing or unreadable file, tensors that are not the config's model's, a field that is not a number
where one is needed, and integer tensors."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from retention.hf import load_hf
from tests.hf.common import save_tiny

pytestmark = pytest.mark.integration  # its checkpoints are built by transformers on torch: make test-integration


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Llama and a tiny Qwen2 checkpoint folder, saved once."""
    root = tmp_path_factory.mktemp("hf")
    for name, architecture in (("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")):
        save_tiny(root / name, architecture)
    return root


def edited(saved, tmp_path, name: str, **fields):
    """A copy of the saved checkpoint `name` whose config.json has `fields` set (None: removed)."""
    folder = tmp_path / name
    shutil.copytree(saved / name, folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in fields.items():
        config.pop(key) if value is None else config.__setitem__(key, value)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "name, fields, message",
    [
        ("llama", dict(hidden_act="gelu"), r"hidden_act='gelu' is not supported"),
        ("llama", dict(attention_bias=True), r"attention_bias=True is not supported"),
        ("llama", dict(mlp_bias=True), r"mlp_bias=True is not supported"),
        ("qwen2", dict(use_sliding_window=True), r"use_sliding_window=True is not supported"),
        ("qwen2", dict(layer_types=["sliding_attention", "full_attention"]), r"layer_types=\['sliding_attention'"),
        (
            "llama",
            dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0)),
            r"rope_parameters.rope_type='yarn' is not supported",
        ),
        ("llama", dict(rope_scaling=dict(type="dynamic", factor=2.0), rope_parameters=None), r"rope_scaling.type="),
        (
            "llama",
            dict(rope_parameters=dict(rope_theta=1e4, partial_rotary_factor=0.5)),
            r"rope_parameters.partial_rotary_factor=0.5",
        ),
        ("llama", dict(attn_logit_softcapping=30.0), r"field attn_logit_softcapping=30.0 is not one the import knows"),
        ("llama", dict(architectures=["GPT2LMHeadModel"]), r"architectures must be one of .*got \['GPT2LMHeadModel'\]"),
        ("llama", dict(intermediate_size=None), r"intermediate_size must be a positive int, got None"),
    ],
)
def test_an_unsupported_field_is_refused_by_name(saved, tmp_path, name, fields, message):
    with pytest.raises(ValueError, match=r"config.json: " + message):
        load_hf(str(edited(saved, tmp_path, name, **fields)))


def test_missing_or_damaged_files_are_named(saved, tmp_path):
    with pytest.raises(ValueError, match=r"folder must be a Hugging Face checkpoint folder, got .*nowhere"):
        load_hf(str(tmp_path / "nowhere"))
    for gone, message in (
        ("config.json", r"config.json is missing"),
        ("tokenizer.json", r"tokenizer.json is missing"),
        ("model.safetensors", r"holds no weights: neither model.safetensors nor model.safetensors.index.json"),
    ):
        folder = edited(saved, tmp_path / gone, "llama")
        (folder / gone).unlink()
        with pytest.raises(ValueError, match=message):
            load_hf(str(folder))
    folder = edited(saved, tmp_path / "cut", "llama")
    raw = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=r"model.safetensors cannot be read as safetensors"):
        load_hf(str(folder))
    folder = edited(saved, tmp_path / "layers", "llama", num_hidden_layers=3)
    with pytest.raises(ValueError, match=r"does not hold the tensors of this model .*missing \['model.layers.2"):
        load_hf(str(folder))
    folder = edited(saved, tmp_path / "width", "llama", intermediate_size=80)
    with pytest.raises(ValueError, match=r"mlp.down.kernel is \[72, 48\], the config's model needs \[80, 48\]"):
        load_hf(str(folder))


def test_rope_scaling_beside_rope_parameters_is_not_ignored(saved, tmp_path):
    """A transformers-5 config (rope_parameters: theta and default) whose rope_scaling asks for yarn is refused as
    yarn alone is: transformers reads rope_scaling first."""
    folder = edited(saved, tmp_path, "llama", rope_scaling=dict(rope_type="yarn", factor=4.0))
    assert json.loads((folder / "config.json").read_text())["rope_parameters"]["rope_type"] == "default"
    with pytest.raises(ValueError, match=r"config.json: rope_scaling.rope_type='yarn' is not supported"):
        load_hf(str(folder))
    linear = dict(rope_type="linear", factor=4.0)  # applied (test_import), but not over another theta
    folder = edited(saved, tmp_path / "theta", "llama", rope_scaling=linear, rope_parameters=dict(rope_theta=5e5))
    with pytest.raises(ValueError, match=r"rope_parameters.rope_theta=500000.0 .*rope_scaling is read instead"):
        load_hf(str(folder))


def test_a_non_numeric_rope_theta_or_an_integer_tensor_is_refused_by_name(saved, tmp_path):
    folder = edited(saved, tmp_path / "theta", "llama", rope_parameters=dict(rope_theta="1e4x", rope_type="default"))
    message = rf"{folder / 'config.json'}: rope_parameters.rope_theta='1e4x' must be a number"
    with pytest.raises(ValueError, match=message):
        load_hf(str(folder))
    folder = edited(saved, tmp_path / "int8", "llama")
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = np.clip(np.round(tensors[name] * 100), -127, 127).astype(np.int8)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"the weights in {folder}: {name} is int8, not a floating-point tensor"):
        load_hf(str(folder))
