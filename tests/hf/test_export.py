"""Export whole: an A-only model (Llama, Qwen2, Qwen3) or a W-only one (Mistral) written in the Llama layout loads
in transformers with no custom code and gives the same logits; a tiny text run of softmax attention with a
tokenizer file exports to a folder that transformers loads (its logits the run's model's) and load_run reads back
with the run's tokenizer, config.json stating the built model's sizes; a damaged tokenizer.json is refused."""

import json
import stat

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from retention import generate, load_run
from retention.data.tokenizer import ByteTokenizer
from retention.export import EXPORT_FILES, export_run
from retention.hf import load_hf
from retention.hf.config_out import REMOTE_FILES, hf_config, hf_tensors
from retention.train import train
from tests.data.test_text_tokenizer_file import llama2_style
from tests.hf.common import ISSUE_TEXT, VOCAB, assert_encodes_as, save_tiny, torch, torch_logits, transformers
from tests.hf.test_import import assert_float32_close
from tests.train.common import compose_config
from tests.train.test_checkpoint import assert_same_params
from tests.train.test_text_eval import text_run

pytestmark = pytest.mark.integration  # checked against transformers: make test-integration

jnp = pytest.importorskip("jax.numpy")
NEW = 12  # tokens generated


@pytest.mark.parametrize(
    "architecture, overrides",
    [
        ("LlamaForCausalLM", {}),
        ("Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
        ("Qwen3ForCausalLM", {}),
        ("MistralForCausalLM", dict(sliding_window=5)),
    ],
)
def test_the_llama_layout_loads_in_transformers(architecture, overrides, tmp_path):
    save_tiny(tmp_path / "in", architecture, **overrides)
    model, _ = load_hf(str(tmp_path / "in"))
    config = hf_config(model.config, max_position_embeddings=64)
    layout, tensors = hf_tensors(model)
    assert layout == "llama" and config["architectures"] == [architecture]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(tmp_path / "out" / "model.safetensors"), metadata={"format": "pt"})
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).float().eval()
    tokens = np.random.default_rng(1).integers(0, VOCAB, (2, 12))
    assert_float32_close(torch_logits(reloaded, tokens), np.asarray(model(jnp.asarray(tokens, jnp.int32))))


def attention_run(tmp_path, tokenizer: list[str]):
    """(the run folder, the export folder) of a tiny text run of softmax attention over the documents of text_run
    (under tmp_path/docs), with the tokenizer overrides `tokenizer`, trained one step and exported."""
    overrides = text_run(tmp_path, [])
    keep = [o for o in overrides if not o.startswith(("model", "data.tokenizer"))]
    extra = [
        "model=softmax",  # base.yaml's QK-norm: the Qwen3 layout
        "model.conv_size=0",
        "model.n_layers=2",
        "model.n_heads=2",
        "model.n_kv_heads=1",
        "model.head_dim=8",
        "model.target_params=30000",  # size_config picks d_model, not the preset's 128
        "trainer.steps=1",
        "optim.warmup_steps=0",
        "trainer.eval_scales=[1]",
        *tokenizer,
    ]
    run, out = tmp_path / "run", tmp_path / "out"
    train(compose_config([*keep, *extra]), str(run))
    export_run(str(run), str(out))
    return run, out


def test_an_attention_run_exports_whole(tmp_path):
    text_run(tmp_path, [])  # writes the documents under tmp_path/docs
    llama2_style([p.read_text() for p in sorted((tmp_path / "docs").iterdir())], tmp_path / "foreign.json")
    file = ["data.tokenizer=file", f"data.tokenizer_file={tmp_path / 'foreign.json'}", 'data.eod_token="</s>"']
    run, out = attention_run(tmp_path, file)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "run_record.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    llama_layout = [f for f in EXPORT_FILES if f not in REMOTE_FILES]  # transformers runs it with its own code
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == dict.fromkeys(llama_layout, 0o644)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert (out / "tokenizer.json").read_bytes() == (run / "tokenizer.json").read_bytes()
    model, cfg, tokenizer = load_run(str(run))
    exported, exported_cfg, exported_tokenizer = load_run(str(out))
    assert_same_params(nnx.state(exported), nnx.state(model))
    assert exported_cfg == cfg and exported_tokenizer.identity == tokenizer.identity
    assert tokenizer.eod == tokenizer.tokenizer.token_to_id("</s>")
    config = json.loads((out / "config.json").read_text())
    lm = model.config
    assert config["architectures"] == ["Qwen3ForCausalLM"] and lm.pattern == "A"
    assert config["hidden_size"] == lm.d_model != cfg.model.d_model == 128  # the built model's size
    assert config["intermediate_size"] == lm.mlp_hidden and config["eos_token_id"] == tokenizer.eod
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out)).float().eval()
    tokens = np.asarray(tokenizer.encode("def f(a, b):\n    return x = 1"))[None, :16]
    assert_float32_close(torch_logits(reloaded, tokens), np.asarray(exported(jnp.asarray(tokens, jnp.int32))))
    assert_encodes_as(transformers.AutoTokenizer.from_pretrained(str(out)), tokenizer)

    (out / "tokenizer.json").write_text((tmp_path / "foreign.json").read_text().replace("<unk>", "<UNK>"))
    with pytest.raises(ValueError, match=r"tokenizer.json is not the run's tokenizer: fingerprint"):
        load_run(str(out))


def generated(model, batch, eod: int) -> np.ndarray:
    """The NEW tokens after each prompt of `batch` (input_ids and attention_mask) by transformers' greedy generate:
    a row that ends at EOD is filled with EOD (the pad) to NEW, as generate fills it when another row runs on;
    generate stops when every row has ended, so its own width is not NEW and its last NEW columns can hold prompt."""
    new = model.generate(**batch, max_new_tokens=NEW, do_sample=False).numpy()[:, batch["input_ids"].shape[1] :]
    return np.pad(new, ((0, 0), (0, NEW - new.shape[1])), constant_values=eod)


# bytes: its tokenizer is checked in the quick tier by test_tokenizer_out.py
@pytest.mark.parametrize("kind", ["bpe", pytest.param("bytes", marks=pytest.mark.slow)])
def test_transformers_generates_a_padded_batch_of_an_export(kind, tmp_path):
    """A batch of prompts of several lengths, encoded by AutoTokenizer (left-padded with EOD, with an attention
    mask), runs through transformers' greedy generate to each prompt's generate alone and to retention.generate."""
    tokenizer = ["data.tokenizer=bpe", "data.vocab_size=300"] if kind == "bpe" else []
    run, out = attention_run(tmp_path, tokenizer)
    exported, _, tokenizer = load_run(str(out))
    tokenizer = tokenizer or ByteTokenizer()
    auto = transformers.AutoTokenizer.from_pretrained(str(out))
    assert_encodes_as(auto, tokenizer)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out)).float().eval()
    assert reloaded.generation_config.pad_token_id == reloaded.generation_config.eos_token_id == tokenizer.eod

    prompts = [ISSUE_TEXT, "def f(a, b):\n    return x = 1", "héllo ✓", "x"]
    batch = auto(prompts, padding=True, return_tensors="pt")
    assert (batch.attention_mask[:, 0] == 0).any() and (batch.attention_mask[:, -1] == 1).all()  # left padding
    lengths = jnp.asarray(batch.attention_mask.sum(1).numpy(), jnp.int32)
    with torch.no_grad():
        early = int(generated(reloaded, batch, tokenizer.eod)[-1, 1])  # a token the batch writes: rows end early
        for eod in (tokenizer.eod, early):  # a random model seldom writes </s>; `early` checks rows that end
            reloaded.generation_config.eos_token_id = reloaded.generation_config.pad_token_id = eod
            padded = generated(reloaded, batch, eod)
            for row, prompt in zip(padded, prompts):
                assert row.tolist() == generated(reloaded, auto(prompt, return_tensors="pt"), eod)[0].tolist()
            tokens = jnp.asarray(batch.input_ids.numpy(), jnp.int32)
            want = generate(exported, tokens, NEW, prompt_lengths=lengths, temperature=0.0, eos_id=eod).tokens
            np.testing.assert_array_equal(padded, np.asarray(want)[:, -NEW:])
