"""Import: tiny random Llama, Qwen2 (q/k/v biases), Qwen3 (q/k norms), Mistral (a sliding window of 5 tokens, as W
layers) and a tied Llama 3 with its "llama3" RoPE scaling, built and saved by transformers, give transformers'
float32 logits after load_hf, in one forward and in a prefill then decode steps; a sharded checkpoint reads as the
single file does; the tokenizer comes with the model; the library itself never imports torch."""

import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

from retention.hf import load_hf
from retention.nn import count_params
from tests.hf.common import VOCAB, save_tiny, torch_logits
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


def assert_float32_close(got, want):
    """Equal to float32 rounding: 1e-5 relative, 1e-5 of the largest logit absolute."""
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


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
    want = torch_logits(reference, tokens)
    assert_float32_close(np.asarray(model(jnp.asarray(tokens, jnp.int32))), want)
    logits, caches = model.prefill(jnp.asarray(tokens[:, :T0], jnp.int32), T, step_tokens=STEP)
    steps = [np.asarray(logits)]
    for t in range(T0, T, STEP):
        logits, caches = model.decode_step(jnp.asarray(tokens[:, t : t + STEP], jnp.int32), caches)
        steps.append(np.asarray(logits))
    assert_float32_close(np.concatenate(steps, axis=1), want)
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
