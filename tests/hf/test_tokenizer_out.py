"""An export's tokenizer files (retention/hf/tokenizer_out.py): transformers' AutoTokenizer of them encodes random
texts (multi-byte characters, newlines, runs of spaces) to the run's ids for each kind of tokenizer a text run has
(bytes, a BPE trained here, a foreign tokenizer.json), ends and pads with EOD, on the left, as generation_config.json
and special_tokens_map.json say too; a foreign file whose post-processor adds a BOS is written with a warning naming
it; an eod that is no id of the tokenizer and a missing transformers are refused, naming them."""

import json
import sys

import numpy as np
import pytest

from retention.data.tokenizer import EOD_TOKEN, ByteTokenizer, HFTokenizer
from retention.hf.tokenizer_out import byte_tokenizer, write_tokenizer_files
from tests.data.test_text_tokenizer_file import gpt2_style, llama2_style
from tests.hf.common import assert_encodes_as, random_texts, transformers

pytestmark = pytest.mark.integration  # checked against transformers: make test-integration

CODE = ["def f(a, b):\n    return a + b\n", "héllo ✓ wörld\n\n", "    x = [1, 2]\n"]


def corpus() -> list[str]:
    """Texts to train tokenizers on: code-like lines (so that merges span spaces and multi-byte characters) and
    random texts."""
    return CODE * 40 + random_texts(np.random.default_rng(0), 200)


def run_tokenizer(kind: str, tmp_path):
    """(the run's tokenizer: ByteTokenizer or HFTokenizer, its `tokenizers.Tokenizer`) of a tokenizer kind."""
    if kind == "bytes":
        return ByteTokenizer(), byte_tokenizer()
    if kind == "bpe":
        tokenizer = HFTokenizer.train(iter(corpus()), 400)
    else:
        llama2_style(corpus(), tmp_path / "foreign.json")
        tokenizer = HFTokenizer.load(str(tmp_path / "foreign.json"), "</s>")
    return tokenizer, tokenizer.tokenizer


@pytest.mark.parametrize("kind", ["bytes", "bpe", "file"])
def test_transformers_reads_each_tokenizer_as_the_run_encodes(kind, tmp_path, caplog):
    tokenizer, hf = run_tokenizer(kind, tmp_path)
    write_tokenizer_files(str(tmp_path / "out"), hf, tokenizer.eod)
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert_encodes_as(auto, tokenizer)
    special = json.loads((tmp_path / "out" / "special_tokens_map.json").read_text())
    assert special == dict.fromkeys(["eos_token", "pad_token"], hf.id_to_token(tokenizer.eod))
    generation = transformers.GenerationConfig.from_pretrained(str(tmp_path / "out"))
    assert generation.eos_token_id == generation.pad_token_id == tokenizer.eod
    assert not [r for r in caplog.records if r.name.startswith("retention")]  # nothing added around a text


def test_the_bytes_tokenizer_is_bytes_for_any_text():
    """byte_tokenizer gives ByteTokenizer's ids for texts of any Unicode character (surrogates aside: not UTF-8),
    the end-of-document token written in a text included (it is text), and EOD_TOKEN is id 256."""
    tokenizer, hf = ByteTokenizer(), byte_tokenizer()
    hf.encode_special_tokens = True  # as the run encodes its documents (HFTokenizer, split_special_tokens)
    rng = np.random.default_rng()
    for _ in range(500):
        codes = [c for c in rng.integers(0, 0x110000, rng.integers(0, 30)) if not 0xD800 <= c < 0xE000]
        text = "".join(map(chr, codes)) + f" {EOD_TOKEN}<0x41>\r\n"
        assert hf.encode(text).ids == tokenizer.encode(text).tolist(), text
    assert hf.token_to_id(EOD_TOKEN) == tokenizer.eod == 256 and hf.get_vocab_size() == tokenizer.vocab_size


def test_a_tokenizer_that_adds_a_bos_is_written_with_a_warning(tmp_path, caplog):
    gpt2_style(corpus(), tmp_path / "foreign.json")
    tokenizer = HFTokenizer.load(str(tmp_path / "foreign.json"), "<|endoftext|>")
    write_tokenizer_files(str(tmp_path / "out"), tokenizer.tokenizer, tokenizer.eod)
    assert "adds ['<|endoftext|>'] around a text" in caplog.text and "add_special_tokens=False" in caplog.text
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    bos = tokenizer.tokenizer.token_to_id("<|endoftext|>")  # the file's, added before each text
    for text in random_texts(np.random.default_rng(), 50):
        ids = tokenizer.encode(text).tolist()
        assert auto(text, add_special_tokens=False).input_ids == ids and auto(text).input_ids == [bos, *ids]


@pytest.mark.parametrize("eod", [257, -1, "256", None])
def test_an_eod_that_is_no_id_is_refused(eod, tmp_path):
    with pytest.raises(ValueError, match=rf"eod must be an id of the tokenizer \(0 \.\. 256\), got {eod!r}"):
        write_tokenizer_files(str(tmp_path), byte_tokenizer(), eod)
    assert not list(tmp_path.iterdir())


def test_a_missing_transformers_names_the_train_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ModuleNotFoundError, match=r"needs 'transformers'.*pip install 'retention-jax\[train\]'"):
        write_tokenizer_files(str(tmp_path), byte_tokenizer(), ByteTokenizer.eod)
