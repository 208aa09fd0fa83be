"""Text from Hugging Face `datasets` (local text and json files, offline) and the byte-level BPE tokenizer:
trained on the training split, saved, reloaded with identical ids, reused from the run folder."""

import json
import os

import numpy as np
import pytest

from retention.data import Text, corpus
from retention.data.tokenizer import EOD_TOKEN, HFTokenizer

SEED = int(np.random.SeedSequence().generate_state(1)[0])


def docs_of(data: Text, split: str) -> list[str]:
    """The documents of a split: its ids cut at each EOD, decoded."""
    ids = [int(i) for i in data.splits[split]]
    out, run = [], []
    for i in ids:
        if i == data.eod:
            out.append(data.tokenizer.decode(run))
            run = []
        else:
            run.append(i)
    assert not run  # the split ends with EOD
    return out


def sentences(rng, n: int) -> list[str]:
    words = ["power", "retention", "state", "héllo", "✓", "def", "return", "x = 1\n", "attention"]
    return [" ".join(rng.choice(words, int(rng.integers(20, 60)))) + f" #{i}" for i in range(n)]


@pytest.fixture(autouse=True)
def offline_hf(tmp_path, monkeypatch):
    """datasets reads local files only, its cache under tmp_path."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))


def expected_split(texts: list[str], split: str, eval_fraction: float) -> list[str]:
    return [t for i, t in enumerate(texts) if corpus.in_eval(str(i), eval_fraction) == (split == "eval")]


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_json_rows_are_documents(tmp_path, streaming):
    texts = sentences(np.random.default_rng(SEED), 30)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts)))
    data = Text(
        seq_len=8,
        batch_size=2,
        source="hf",
        hf_name="json",
        hf_data_files=[str(path)],
        hf_text_field="body",
        hf_streaming=streaming,
        eval_fraction=0.3,
        cache_dir=str(tmp_path / "c"),
    )
    for split in ("train", "eval"):
        assert docs_of(data, split) == expected_split(texts, split, 0.3)
    assert data.batch(0).inputs.shape == (2, 8)


def test_hf_text_files_are_documents(tmp_path):
    texts = [t.replace("#", "\n#") for t in sentences(np.random.default_rng(SEED), 12)]  # several lines each
    files = []
    for i, t in enumerate(texts):
        files.append(str(tmp_path / f"{i:02d}.txt"))
        with open(files[-1], "w") as f:
            f.write(t)
    data = Text(
        seq_len=8,
        batch_size=2,
        source="hf",
        hf_name="text",
        hf_data_files=files,
        eval_fraction=0.4,
        cache_dir=str(tmp_path / "c"),
    )
    assert sorted(docs_of(data, "train") + docs_of(data, "eval")) == sorted(texts)  # a file is one document


def test_hf_missing_field_is_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ValueError, match="hf_text_field='text' is not a column"):
        Text(
            seq_len=8,
            batch_size=2,
            source="hf",
            hf_name="json",
            hf_data_files=[str(path)],
            cache_dir=str(tmp_path / "c"),
        )


def write_corpus(folder, n: int = 40) -> list[str]:
    texts = sentences(np.random.default_rng(SEED), n)
    os.makedirs(folder)
    for i, t in enumerate(texts):
        with open(os.path.join(folder, f"{i}.txt"), "w") as f:
            f.write(t)
    return texts


def test_bpe_trained_saved_reloaded_and_reused(tmp_path):
    texts = write_corpus(tmp_path / "docs")
    tokenizer_path = str(tmp_path / "run" / "tokenizer.json")
    kwargs = dict(seq_len=8, batch_size=2, path=str(tmp_path / "docs"), eval_fraction=0.3, tokenizer="bpe")
    data = Text(**kwargs, vocab_size=300, cache_dir=str(tmp_path / "c1"), tokenizer_path=tokenizer_path)
    bpe = data.tokenizer
    assert os.path.isfile(tokenizer_path) and 257 < data.vocab_size <= 300
    assert np.asarray(data.splits["train"]).dtype == np.uint16
    for split in ("train", "eval"):  # every document decodes back to its text
        assert sorted(docs_of(data, split)) == sorted(
            t for i, t in enumerate(texts) if corpus.in_eval(f"{i}.txt", 0.3) == (split == "eval")
        )
    sample = texts[0] + f" {EOD_TOKEN} ✓"  # EOD written in a document is text, not a boundary
    ids = bpe.encode(sample)
    assert bpe.eod not in ids and bpe.decode(ids) == sample
    assert int(bpe.token_bytes[ids].sum()) == len(sample.encode())  # each id's bytes, for bits per byte
    assert len(ids) < len(sample.encode())  # merges learnt
    reloaded = HFTokenizer.load(tokenizer_path)
    np.testing.assert_array_equal(reloaded.encode(sample), ids)
    assert reloaded.identity == bpe.identity
    # a resumed run reads the run folder's tokenizer, even where another vocab_size or cache would train anew
    resumed = Text(**kwargs, vocab_size=280, cache_dir=str(tmp_path / "c2"), tokenizer_path=tokenizer_path)
    assert resumed.tokenizer.identity == bpe.identity and resumed.vocab_size == data.vocab_size
    np.testing.assert_array_equal(resumed.splits["train"], data.splits["train"])
    fresh = Text(**kwargs, vocab_size=280, cache_dir=str(tmp_path / "c2"))
    assert fresh.vocab_size <= 280 and fresh.tokenizer.identity != bpe.identity


def test_a_file_added_under_a_glob_makes_a_new_cache(tmp_path):
    """data_files as a glob pattern: the cache key and the corpus fingerprint list the files it matches, so a file
    added under it is tokenised (never the old cache's ids served) and a rewritten one changes the fingerprint."""
    texts = sentences(np.random.default_rng(SEED), 40)
    (tmp_path / "rows").mkdir()
    for part in range(2):
        rows = "".join(json.dumps({"text": t}) + "\n" for t in texts[part * 10 : part * 10 + 10])
        (tmp_path / "rows" / f"{part}.jsonl").write_text(rows)
    kwargs = dict(
        seq_len=8, batch_size=2, source="hf", hf_name="json", hf_data_files=[str(tmp_path / "rows" / "*.jsonl")]
    )
    kwargs.update(eval_fraction=0.3, cache_dir=str(tmp_path / "c"))
    before = Text(**kwargs)
    fingerprint = before.fingerprints()["corpus"]
    assert docs_of(before, "train") == expected_split(texts[:20], "train", 0.3)
    (tmp_path / "rows" / "2.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[20:]))
    after = Text(**kwargs)
    assert docs_of(after, "train") == expected_split(texts, "train", 0.3)
    assert len(after.splits["train"]) > len(before.splits["train"])
    assert after.fingerprints()["corpus"] != fingerprint
    fingerprint = after.fingerprints()["corpus"]
    (tmp_path / "rows" / "2.jsonl").write_text("".join(json.dumps({"text": t[::-1]}) + "\n" for t in texts[20:]))
    assert after.fingerprints()["corpus"] != fingerprint  # the same size, other content
