"""Import: tiny random Llama, Qwen2 (q/k/v biases), Qwen3 (q/k norms), Mistral (a sliding window of 5 tokens, as W
layers) and a tied Llama 3 with its "llama3" RoPE scaling, built and saved by transformers, give transformers'
float32 logits after load_hf, in one forward and in a prefill then decode steps; a sharded checkpoint reads as the
single file does; the tokenizer comes with the model; the library itself never imports torch. Where transformers
reads a config in its own way, load_hf follows it: a tied config whose file holds a head of its own keeps that head,
and a rope_scaling beside rope_parameters is applied."""

import json
import logging
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

from retention.hf import load_hf
from retention.nn import count_params
from tests.hf.common import (
    VOCAB,
    assert_float32_close,
    assert_gives_transformers_logits,
    save_tiny,
    torch,
    torch_logits,
    transformers,
)
from tests.train.common import ROOT

pytestmark = pytest.mark.integration  # checked against transformers: make test-integration

jnp = pytest.importorskip("jax.numpy")

LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=500000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,  # every frequency of head_dim 16 is scaled or blended, none kept
)
CASES = {
    "llama": ("LlamaForCausalLM", {}),
    "qwen2": ("Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3ForCausalLM", {}),
    "mistral_window5": ("MistralForCausalLM", dict(sliding_window=5)),
    "llama3_tied": ("LlamaForCausalLM", dict(tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE)),
}
T, T0, STEP = 20, 12, 4  # a prompt of T0 tokens, then decode steps of STEP tokens up to T


@pytest.mark.parametrize(  # plain llama is a further case: llama3_tied has its layout, tied and llama3-scaled
    "case", [pytest.param(c, marks=[pytest.mark.slow] * (c == "llama")) for c in sorted(CASES)]
)
def test_imported_model_gives_transformers_logits(case, tmp_path):
    architecture, overrides = CASES[case]
    reference = save_tiny(tmp_path, architecture, **overrides)
    model, tokenizer = load_hf(str(tmp_path))
    assert set(model.config.layer_kinds) == ({"W"} if "sliding_window" in overrides else {"A"})
    assert model.param_count() == count_params(model.config) == sum(p.numel() for p in reference.parameters())
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, T))
    assert_gives_transformers_logits(model, reference, tokens, T0, STEP)
    assert tokenizer.eod == 1 and tokenizer.decode(tokenizer.encode("w5 w7")).split() == ["w5", "w7"]


def test_a_sharded_checkpoint_reads_as_one_file(tmp_path):
    reference = save_tiny(tmp_path / "one", "Qwen2ForCausalLM")
    reference.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    (tmp_path / "sharded" / "tokenizer.json").write_bytes((tmp_path / "one" / "tokenizer.json").read_bytes())
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    one, sharded = (nnx.to_pure_dict(nnx.state(load_hf(str(tmp_path / n))[0])) for n in ("one", "sharded"))
    for a, b in zip(*(sorted(nnx.traversals.flatten_mapping(x).items()) for x in (one, sharded))):
        assert a[0] == b[0]
        np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[1]))


def test_the_library_never_imports_torch():
    """transformers and torch are test dependencies only: the package and the import load neither (retention.train,
    and so load_run and the export, loads tensorboardX, which imports torch when it is installed)."""
    code = "import sys, retention, retention.hf\nprint(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def edit_config(folder, **fields) -> None:
    """Set `fields` in the config.json saved in `folder`."""
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


def test_a_tied_config_whose_file_holds_its_own_head_keeps_that_head(tmp_path, caplog):
    """tie_word_embeddings true, but model.safetensors holds an lm_head.weight other than the embedding:
    transformers keeps the file's head, untied (with a warning), and so does load_hf."""
    save_tiny(tmp_path, "LlamaForCausalLM")  # untied: the file holds its own lm_head.weight
    edit_config(tmp_path, tie_word_embeddings=True)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    assert not torch.equal(reference.lm_head.weight, reference.model.embed_tokens.weight)
    with caplog.at_level(logging.WARNING, logger="retention.hf.load"):
        model, _ = load_hf(str(tmp_path))
    assert not model.config.tie_embeddings
    assert "tie_word_embeddings is true but" in caplog.text and "lm_head.weight" in caplog.text
    tokens = np.random.default_rng(1).integers(0, VOCAB, (2, T))
    assert_float32_close(np.asarray(model(jnp.asarray(tokens, jnp.int32))), torch_logits(reference, tokens))


def test_rope_scaling_beside_rope_parameters_is_read_as_transformers_reads_it(tmp_path):
    """A transformers-5 config (rope_parameters: theta, default) with a linear rope_scaling added: transformers
    applies the scaling, and so does load_hf."""
    save_tiny(tmp_path, "LlamaForCausalLM")
    edit_config(tmp_path, rope_scaling=dict(rope_type="linear", factor=4.0))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    assert reference.config.rope_parameters["rope_type"] == "linear"
    model, _ = load_hf(str(tmp_path))
    assert (model.config.rope_scaling, model.config.rope_factor) == ("linear", 4.0)
    tokens = np.random.default_rng(2).integers(0, VOCAB, (2, T))
    assert_float32_close(np.asarray(model(jnp.asarray(tokens, jnp.int32))), torch_logits(reference, tokens))
