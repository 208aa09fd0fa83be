"""Import of transformers' Mamba2: tiny random Mamba2ForCausalLM checkpoints (one group of B and C; two groups with
another head count, expand and convolution; tied embeddings without a conv bias), built and saved by transformers,
give transformers' float32 logits after load_hf as M layers without MLPs, in one forward of an odd length and in a
prefill then decode steps, and greedy decoding picks transformers' tokens; an older checkpoint's
backbone.embedding.weight reads as transformers reads it; init_from=hf: loads it; a config the M mixer cannot
honour is refused by name before any weight is read."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from retention.generation import generate
from retention.hf import load_hf
from retention.nn import count_params
from retention.train.init_from import load_source
from tests.hf.common import (
    VOCAB,
    assert_float32_close,
    assert_gives_transformers_logits,
    greedy_reference,
    save_tiny_mamba2,
    torch_logits,
)

pytestmark = pytest.mark.integration  # checked against transformers: make test-integration

jnp = pytest.importorskip("jax.numpy")

CASES = {
    "groups1": {},
    "groups2": dict(num_heads=6, head_dim=16, expand=3, n_groups=2, conv_kernel=3, state_size=5),
    "tied_no_conv_bias": dict(n_groups=4, tie_word_embeddings=True, use_conv_bias=False),
}
T, T0, STEP, NEW = 19, 11, 4, 6  # an odd length; a prompt of T0 tokens then decode steps of STEP tokens up to T


@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_mamba2_gives_transformers_logits(case, tmp_path):
    reference = save_tiny_mamba2(tmp_path, **CASES[case])
    model, tokenizer = load_hf(str(tmp_path))
    assert model.config.layer_kinds == "MM" and model.config.mlp_width == 0
    assert all(block.mlp is None and block.mlp_norm is None for block in model.blocks)
    zero_bias = 0 if reference.config.use_conv_bias else 2 * reference.backbone.layers[0].mixer.conv_dim
    want_count = sum(p.numel() for p in reference.parameters()) + zero_bias  # use_conv_bias false: a zero bias here
    assert model.param_count() == count_params(model.config) == want_count
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, T))
    assert_gives_transformers_logits(model, reference, tokens, T0, STEP)
    out = generate(model, jnp.asarray(tokens[:, :T0], jnp.int32), NEW, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(out.tokens), greedy_reference(reference, tokens[:, :T0], NEW))
    assert tokenizer.eod == 1


def test_an_older_embedding_name_and_init_from_read_as_transformers_reads_them(tmp_path):
    """backbone.embedding.weight (mamba_ssm's name) is read as backbone.embeddings.weight, as transformers'
    Mamba2Model renames it; init_from=hf:DIR loads the same model."""
    reference = save_tiny_mamba2(tmp_path, n_groups=2)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["backbone.embedding.weight"] = tensors.pop("backbone.embeddings.weight")
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model, _ = load_hf(str(tmp_path))
    tokens = np.random.default_rng(1).integers(0, VOCAB, (2, T))
    assert_float32_close(np.asarray(model(jnp.asarray(tokens, jnp.int32))), torch_logits(reference, tokens))
    loaded = load_source(f"hf:{tmp_path}")
    assert loaded.config == model.config
    tokens = jnp.asarray(tokens, jnp.int32)
    np.testing.assert_array_equal(np.asarray(loaded(tokens)), np.asarray(model(tokens)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Mamba2 checkpoint folder, saved once."""
    folder = tmp_path_factory.mktemp("mamba2")
    save_tiny_mamba2(folder, n_groups=2)
    return folder


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(hidden_act="gelu"), r"hidden_act='gelu' is not supported .*silu"),
        (dict(use_bias=True), r"use_bias=True is not supported"),
        (dict(layer_norm_epsilon=1e-6), r"layer_norm_epsilon=1e-06 is not supported .*1e-05"),
        (dict(time_step_limit=[0.0, 10.0]), r"time_step_limit=\[0.0, 10.0\] is not supported"),
        (dict(time_step_limit=[0.01, {"__float__": "Infinity"}]), r"time_step_limit=\[0.01, "),
        (dict(num_heads=4), r"num_heads=4 is not supported .*num_heads \* head_dim = expand \* hidden_size = 64"),
        (dict(n_groups=3), r"n_groups=3 is not supported by the import \(a divisor of num_heads=8\)"),
        (dict(conv_kernel=0), r"conv_kernel must be a positive int, got 0"),
        (dict(norm_before_gate=True), r"field norm_before_gate=True is not one the import knows"),
        (
            dict(architectures=["Mamba2Model"]),
            r"architectures must be one of .*Mamba2ForCausalLM.*got \['Mamba2Model'\]",
        ),
    ],
)
def test_a_config_the_m_mixer_cannot_honour_is_refused_by_name(saved, tmp_path, fields, message):
    """Refused from config.json alone: the weights are never read (the folder's model.safetensors is removed)."""
    config = json.loads((saved / "config.json").read_text()) | fields
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_bytes((saved / "tokenizer.json").read_bytes())
    with pytest.raises(ValueError, match=r"config.json: " + message):
        load_hf(str(tmp_path))


def test_transformers_5_writes_the_limit_as_a_dict_and_it_is_read(saved):
    """config.json's time_step_limit [0.0, {"__float__": "Infinity"}] (transformers 5's JSON for inf) loads."""
    assert json.loads((saved / "config.json").read_text())["time_step_limit"][1] == {"__float__": "Infinity"}
    assert load_hf(str(saved))[0].config.ssm_groups == 2
