"""Import of transformers' Qwen3-Next as D layers: tiny random Qwen3NextForCausalLM checkpoints whose layers are all
Gated DeltaNet with dense MLPs (as many value heads as key heads; twice as many, with head counts and dims that are
not powers of two and another convolution; tied embeddings with experts that no layer's decoder_sparse_step
reaches), built and saved by transformers, give transformers' float32 logits (its torch fallback of the chunked gated
delta rule) after load_hf, over 70 tokens (past one chunk of 64, not a multiple of it) in one forward and in a prefill
then decode steps, and greedy decoding picks transformers' tokens; the multi-token-prediction head's tensors are
skipped and init_from=hf: loads the same model; a config the D layers cannot honour is refused by name before any
weight is read, a real Qwen3-Next config (mixtures of experts) by num_experts."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from retention.generation import generate
from retention.hf import load_hf
from retention.hf.qwen3_next_in import qwen3_next_config_from_hf
from retention.nn import count_params
from retention.train.init_from import load_source
from tests.hf.common import (
    VOCAB,
    assert_gives_transformers_logits,
    greedy_reference,
    save_tiny_qwen3_next,
)

pytestmark = pytest.mark.integration  # checked against transformers: make test-integration

jnp = pytest.importorskip("jax.numpy")

CASES = {
    "equal_heads": {},
    "more_value_heads_odd_dims": dict(
        linear_num_key_heads=3,
        linear_num_value_heads=6,
        linear_key_head_dim=10,
        linear_value_head_dim=10,
        linear_conv_kernel_dim=3,
        num_experts=4,
        mlp_only_layers=[0, 1],  # experts configured, every layer dense
    ),
    "tied_sparse_step_past_the_layers": dict(tie_word_embeddings=True, num_experts=4, decoder_sparse_step=3),
}
T, T0, STEP, NEW = 70, 38, 8, 6  # past one chunk of 64 and not a multiple of it; prefill then 4 decode steps


@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_qwen3_next_gives_transformers_logits(case, tmp_path):
    reference = save_tiny_qwen3_next(tmp_path, **CASES[case])
    model, tokenizer = load_hf(str(tmp_path))
    config = reference.config
    assert model.config.layer_kinds == "DD" and model.config.mlp_width == config.intermediate_size
    assert model.config.n_heads == model.config.n_kv_heads == config.linear_num_value_heads
    r, d = config.linear_num_value_heads // config.linear_num_key_heads, config.linear_key_head_dim
    per_layer = (r - 1) * 2 * config.linear_num_key_heads * d * (config.hidden_size + config.linear_conv_kernel_dim)
    repeated = config.num_hidden_layers * per_layer  # q and k's projections and conv taps, repeated per value head
    want_count = sum(p.numel() for p in reference.parameters()) + repeated
    assert model.param_count() == count_params(model.config) == want_count
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, T))
    assert_gives_transformers_logits(model, reference, tokens, T0, STEP)
    out = generate(model, jnp.asarray(tokens[:, :T0], jnp.int32), NEW, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(out.tokens), greedy_reference(reference, tokens[:, :T0], NEW))
    assert tokenizer.eod == 1


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Qwen3-Next checkpoint folder, saved once."""
    folder = tmp_path_factory.mktemp("qwen3_next")
    save_tiny_qwen3_next(folder)
    return folder


def with_config(saved, folder, fields: dict, drop: tuple = ()):
    """`folder` holding the saved checkpoint's config.json with `fields` and without `drop`, and its tokenizer (no
    weights)."""
    config = json.loads((saved / "config.json").read_text()) | fields
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in drop}))
    (folder / "tokenizer.json").write_bytes((saved / "tokenizer.json").read_bytes())
    return folder


@pytest.mark.parametrize(
    "fields, drop, message",
    [
        (dict(hidden_act="gelu"), (), r"hidden_act='gelu' is not supported .*silu"),
        (dict(rms_norm_eps=1e-5), (), r"rms_norm_eps=1e-05 is not supported .*epsilon, 1e-06"),
        (dict(linear_value_head_dim=8), (), r"linear_value_head_dim=8 is not supported .*linear_key_head_dim=12"),
        (dict(linear_num_value_heads=3), (), r"linear_num_value_heads=3 .*multiple of linear_num_key_heads=2"),
        (
            dict(layer_types=["linear_attention", "full_attention"]),
            (),
            r"layer_types=\['linear_attention', 'full_attention'\] is not supported .*sigmoid",
        ),
        (dict(full_attention_interval=2), ("layer_types",), r"full_attention_interval=2 is not supported .*\[1\]"),
        (dict(num_experts=4, mlp_only_layers=[0]), (), r"num_experts=4 is not supported .*mixture of experts .*\[1\]"),
        ({}, ("num_experts",), r"num_experts=512 is not supported"),  # transformers' default
        (dict(num_experts=2, decoder_sparse_step=0), (), r"decoder_sparse_step must be a positive int, got 0"),
        (dict(linear_conv_kernel_dim=0), (), r"linear_conv_kernel_dim must be a positive int, got 0"),
        (dict(attn_output_gate=True), (), r"field attn_output_gate=True is not one the import knows"),
        (dict(architectures=["Qwen3NextModel"]), (), r"architectures must be one of .*Qwen3NextForCausalLM.*"),
    ],
)
def test_a_config_the_d_layers_cannot_honour_is_refused_by_name(saved, tmp_path, fields, drop, message):
    """Refused from config.json alone: the folder holds no weights."""
    with pytest.raises(ValueError, match=r"config.json: " + message):
        load_hf(str(with_config(saved, tmp_path, fields, drop)))


@pytest.mark.parametrize(
    "fields, drop",
    [
        (dict(full_attention_interval=3), ("layer_types",)),  # no layer_types: every 3rd layer of 2 is full
        (dict(decoder_sparse_step=3), ("layer_types", "num_experts", "mlp_only_layers")),  # 512 experts, on no layer
    ],
)
def test_the_layer_kinds_transformers_derives_are_read(saved, fields, drop):
    """Without layer_types, every full_attention_interval-th layer is full attention (4: none of 2 layers); a layer
    has experts when it is on decoder_sparse_step and outside mlp_only_layers, as transformers derives them."""
    config = {k: v for k, v in json.loads((saved / "config.json").read_text()).items() if k not in drop} | fields
    assert qwen3_next_config_from_hf(config).layer_kinds == "DD"


def test_a_real_qwen3_next_config_is_refused_by_num_experts():
    """The fields of Qwen3-Next-80B-A3B's config.json (transformers' Qwen3NextConfig defaults, which follow it):
    512 experts on every layer, refused by num_experts before its full-attention layers."""
    config = dict(
        architectures=["Qwen3NextForCausalLM"],
        model_type="qwen3_next",
        attention_bias=False,
        attention_dropout=0.0,
        decoder_sparse_step=1,
        full_attention_interval=4,
        head_dim=256,
        hidden_act="silu",
        hidden_size=2048,
        intermediate_size=5120,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_value_head_dim=128,
        max_position_embeddings=262144,
        mlp_only_layers=[],
        moe_intermediate_size=512,
        norm_topk_prob=True,
        num_attention_heads=16,
        num_experts=512,
        num_experts_per_tok=10,
        num_hidden_layers=48,
        num_key_value_heads=2,
        output_router_logits=False,
        partial_rotary_factor=0.25,
        rms_norm_eps=1e-6,
        rope_scaling=None,
        rope_theta=10000000,
        router_aux_loss_coef=0.001,
        shared_expert_intermediate_size=512,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        use_cache=True,
        use_sliding_window=False,
        vocab_size=151936,
    )
    with pytest.raises(ValueError, match=r"num_experts=512 is not supported .*mixture of experts .*\[0, 1, 2, "):
        qwen3_next_config_from_hf(config)
    config |= dict(num_experts=0)
    with pytest.raises(ValueError, match=r"full_attention_interval=4 is not supported .*\[3, 7, 11, "):
        qwen3_next_config_from_hf(config)


def test_the_mtp_head_is_skipped_and_init_from_reads_the_folder(saved, tmp_path):
    """mtp.* tensors (the multi-token-prediction head transformers skips) are skipped; init_from=hf:DIR loads the
    same model; an in_proj_qkvz of another shape is refused by name."""
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_bytes((saved / name).read_bytes())
    tensors = load_file(saved / "model.safetensors")
    save_file(tensors | {"mtp.fc.weight": np.ones((4, 4), np.float32)}, tmp_path / "model.safetensors")
    model, _ = load_hf(str(tmp_path))
    loaded = load_source(f"hf:{tmp_path}")
    assert loaded.config == model.config
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, VOCAB, (1, 9)), jnp.int32)
    np.testing.assert_array_equal(np.asarray(loaded(tokens)), np.asarray(model(tokens)))
    name = "model.layers.1.linear_attn.in_proj_qkvz.weight"
    save_file(tensors | {name: tensors[name][:-1]}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=rf"{name} is \[95, 36\], the config's model needs \[96, 36\]"):
        load_hf(str(tmp_path))
