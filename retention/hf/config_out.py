"""An LM as a Hugging Face checkpoint: its config.json (architecture, every size, the layer pattern, the mixer
settings) and its tensors. A model transformers runs with no custom code (every layer A: Llama, Qwen2 with q/k/v
biases, Qwen3 with QK-norm; every layer W: Mistral's sliding window; no short convolution, RoPE on) takes the Llama
layout (names.py: HF names, [out, in] weights); any other takes the "retention" layout: architecture RetentionLM,
one tensor per parameter named by its key path (the LM's own [in, out] layout), which load_run reads and transformers
runs through the export's own modeling_retention.py (retention/hf/remote/, named by config.json's auto_map:
`AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)`)."""

import dataclasses

import jax
import numpy as np
from flax import nnx

from retention.hf.names import llama_from_pure
from retention.nn import LM, LMConfig
from retention.nn.model import convert_layers
from retention.nn.registry import MIXERS

REMOTE_FILES = ("configuration_retention.py", "modeling_retention.py")  # retention/hf/remote/, copied into exports
AUTO_MAP = {
    "AutoConfig": "configuration_retention.RetentionConfig",
    "AutoModelForCausalLM": "modeling_retention.RetentionForCausalLM",
}
MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def weight_name(path) -> str:
    """A parameter's name in the retention layout: its key path joined by dots (blocks.0.mixer.q_proj.kernel.value)."""
    return jax.tree_util.keystr(path, simple=True, separator=".")


def _one_kind(lm: LMConfig) -> LMConfig:
    """`lm` as its layers are built when they are all of one kind (its per-layer settings applied), else `lm`."""
    kinds = set(lm.layer_kinds)
    return lm.for_kind(lm.layer_kinds[0]) if len(kinds) == 1 else lm


def hf_architecture(lm: LMConfig) -> str | None:
    """The transformers architecture that runs `lm` unchanged, None when none does."""
    kinds = set(lm.layer_kinds)
    lm = _one_kind(lm)
    if lm.conv_size or lm.rope_base is None or not lm.mlp_hidden or kinds not in ({"A"}, {"W"}):
        return None
    if kinds == {"W"}:
        return None if lm.qk_norm or lm.qkv_bias else "MistralForCausalLM"
    if lm.qk_norm:
        return None if lm.qkv_bias else "Qwen3ForCausalLM"
    return "Qwen2ForCausalLM" if lm.qkv_bias else "LlamaForCausalLM"


def _rope_parameters(lm: LMConfig) -> dict:
    """transformers' rope_parameters of `lm` (rope_theta and the scaling)."""
    out = {"rope_type": "default" if lm.rope_scaling == "none" else lm.rope_scaling, "rope_theta": lm.rope_base}
    if lm.rope_scaling != "none":
        out["factor"] = lm.rope_factor
    if lm.rope_scaling == "llama3":
        out |= dict(
            low_freq_factor=lm.rope_low_freq_factor,
            high_freq_factor=lm.rope_high_freq_factor,
            original_max_position_embeddings=lm.rope_original_max_len,
        )
    return out


def hf_config(lm: LMConfig, *, max_position_embeddings: int, eos_token_id: int | None = None) -> dict:
    """The Hugging Face config.json of `lm` (the built model's sizes): its architecture's fields when
    hf_architecture has one, else RetentionLM's; both name the layer pattern and carry every mixer setting (the
    LMConfig) under "retention_lm"; RetentionLM's names the export's remote code under "auto_map"."""
    arch = hf_architecture(lm)
    record, lm = dataclasses.asdict(lm), _one_kind(lm)
    config = {
        "architectures": [arch or "RetentionLM"],
        "model_type": MODEL_TYPES.get(arch, "retention"),
        "vocab_size": lm.vocab_size,
        "hidden_size": lm.d_model,
        "intermediate_size": lm.mlp_hidden,
        "num_hidden_layers": lm.n_layers,
        "num_attention_heads": lm.n_heads,
        "num_key_value_heads": lm.n_kv_heads,
        "head_dim": lm.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": lm.norm_eps,
        "tie_word_embeddings": lm.tie_embeddings,
        "max_position_embeddings": max_position_embeddings,
        "dtype": lm.param_dtype,
        "eos_token_id": eos_token_id,
        "layer_pattern": lm.pattern,
        "layer_mixers": [MIXERS[kind].name for kind in lm.layer_kinds],
        "retention_lm": record,
    }
    if arch is None:  # transformers runs it with the export's modeling_retention.py (trust_remote_code=True)
        config["auto_map"] = dict(AUTO_MAP)
    if lm.rope_base is not None:
        config["rope_parameters"] = _rope_parameters(lm)
    if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
        config["attention_bias"] = False
    if arch == "LlamaForCausalLM":
        config["mlp_bias"] = False
    if arch == "MistralForCausalLM":
        config["sliding_window"] = lm.window
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        config |= dict(use_sliding_window=False, layer_types=["full_attention"] * lm.n_layers)
    return config


def hf_tensors(model: LM) -> tuple[str, dict[str, np.ndarray]]:
    """(the layout, "llama" or "retention"; the model's tensors by name in it), see the module docstring."""
    lm = model.config
    if hf_architecture(lm) is None:
        leaves = jax.tree_util.tree_leaves_with_path(nnx.state(model))
        return "retention", {weight_name(p): np.asarray(x) for p, x in leaves}
    unscanned = convert_layers(model, False)
    return "llama", llama_from_pure(unscanned.config, nnx.to_pure_dict(nnx.state(unscanned)))
