"""Any Hugging Face tokenizer.json as the text task's tokenizer (data.tokenizer=file), built here with `tokenizers`:
a GPT-2-style byte-level BPE (whose BOS post-processor and truncation the document encoder skips) and a
Llama-2-style Metaspace BPE with byte fallback. Documents decode back, the chosen end token separates them,
token_bytes counts each token's UTF-8 bytes (bits per byte), the run folder keeps a copy, and an end token the
vocab lacks is refused naming it and what the vocab offers."""

import json
import os

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from retention.data import Text, corpus
from tests.data.test_text_sources import docs_of, write_corpus

SEED = int(np.random.SeedSequence().generate_state(1)[0])


def gpt2_style(texts: list[str], path) -> None:
    """A byte-level BPE with <|endoftext|>, a post-processor adding it before each text and truncation at 16."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    bos = ("<|endoftext|>", tokenizer.token_to_id("<|endoftext|>"))
    tokenizer.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[bos])
    tokenizer.enable_truncation(max_length=16)
    tokenizer.save(str(path))


def llama2_style(texts: list[str], path) -> None:
    """A Metaspace BPE (▁ marks a word start) over ASCII merges with <0x00>..<0xFF> byte-fallback tokens and
    Llama 2's decoder; <unk>, <s>, </s> special."""
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    specials = ["<unk>", "<s>", "</s>"]
    learner.train_from_iterator(
        [t.encode("ascii", "ignore").decode() for t in texts],
        trainers.BpeTrainer(vocab_size=150, special_tokens=specials, show_progress=False),
    )
    spec = json.loads(learner.to_str())
    vocab = dict(spec["model"]["vocab"])
    vocab.update({f"<0x{b:02X}>": len(vocab) + b for b in range(256)})
    merges = [tuple(m) for m in spec["model"]["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tokenizer.pre_tokenizer = learner.pre_tokenizer
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(path))


def file_text(tmp_path, eod_token: str, **kwargs) -> Text:
    """The text task over tmp_path/docs with the tokenizer.json at tmp_path/foreign.json."""
    return Text(
        seq_len=8,
        batch_size=2,
        path=str(tmp_path / "docs"),
        eval_fraction=0.3,
        tokenizer="file",
        tokenizer_file=str(tmp_path / "foreign.json"),
        eod_token=eod_token,
        cache_dir=str(tmp_path / "c"),
        **kwargs,
    )


@pytest.mark.parametrize("style, eod_token, prefix", [(gpt2_style, "<|endoftext|>", ""), (llama2_style, "</s>", " ")])
def test_a_foreign_tokenizer_reads_the_corpus(tmp_path, style, eod_token, prefix):
    """Each document decodes back between end tokens; token_bytes of a text's ids sum to its UTF-8 bytes (with the
    space a Metaspace tokenizer puts before the first word); the run folder keeps the tokenizer."""
    texts = write_corpus(tmp_path / "docs")
    style(texts, tmp_path / "foreign.json")
    run_copy = tmp_path / "run" / "tokenizer.json"
    data = file_text(tmp_path, eod_token, tokenizer_path=str(run_copy))
    raw = Tokenizer.from_file(str(tmp_path / "foreign.json"))
    assert data.eod == raw.token_to_id(eod_token) and data.vocab_size == raw.get_vocab_size()
    for split in ("train", "eval"):
        expected = [t for i, t in enumerate(texts) if corpus.in_eval(f"{i}.txt", 0.3) == (split == "eval")]
        assert sorted(docs_of(data, split)) == sorted(expected)
    rng = np.random.default_rng(SEED)
    for text in [*texts[:5], "x = 1\n  héllo ✓ 中文 " + "".join(rng.choice(list("ab ✓é\n"), 40))]:
        ids = data.tokenizer.encode(text)
        assert data.eod not in ids and data.tokenizer.decode(ids) == text
        assert int(data.token_bytes[ids].sum()) == len((prefix + text).encode())
    assert data.token_bytes[data.eod] == 1
    reread = file_text(tmp_path, eod_token, tokenizer_path=str(run_copy))
    assert reread.tokenizer.identity == data.tokenizer.identity  # the run folder's copy is the same tokenizer
    np.testing.assert_array_equal(reread.splits["train"], data.splits["train"])


def test_an_end_token_the_vocab_lacks_is_named(tmp_path):
    texts = write_corpus(tmp_path / "docs")
    llama2_style(texts, tmp_path / "foreign.json")
    with pytest.raises(ValueError, match=r"eod_token must be a token of the tokenizer at .*foreign.json, got "):
        file_text(tmp_path, "<|endofdocument|>")
    n = Tokenizer.from_file(str(tmp_path / "foreign.json")).get_vocab_size()
    with pytest.raises(
        ValueError, match=rf"got '<eos>' \(not in its vocab of {n}; its added tokens: \['</s>', '<s>', '<unk>'\]\)"
    ):
        file_text(tmp_path, "<eos>")
    assert not os.path.exists(tmp_path / "c")  # refused before any tokenising


def test_the_end_token_is_part_of_the_cache_key(tmp_path):
    """One tokenizer.json with two end tokens: two caches, EOD the chosen id in each."""
    texts = write_corpus(tmp_path / "docs")
    llama2_style(texts, tmp_path / "foreign.json")
    eos, bos = file_text(tmp_path, "</s>"), file_text(tmp_path, "<s>")
    assert eos.tokenizer.identity != bos.tokenizer.identity and eos.eod != bos.eod
    for data in (eos, bos):
        ids = np.asarray(data.splits["train"])
        assert ids[-1] == data.eod and np.sum(ids == data.eod) == len(docs_of(data, "train"))
