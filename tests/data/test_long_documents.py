"""Long documents (`min_doc_bytes`, the `long_text` data config, retention/data/documents.py): both splits hold only
whole documents of at least min_doc_bytes, split by the hash of their names, never one in both; the documents read
one by one carry their files' sha256, bytes and ids; the rule that picks the long ones is deterministic, ordered by
the split hash, and kept whole by a limit."""

import hashlib
import json
import os

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from retention.configs import CONFIG_DIR
from retention.data import Text, corpus
from retention.data.documents import read_documents, select_documents, selection_rule
from retention.data.tokenizer import ByteTokenizer
from retention.train.config import register_configs

SEED = int(np.random.SeedSequence().generate_state(1)[0])
MIN = 600


def name_hash(name: str) -> float:
    """The split's hash as the module docstring states it: blake2b of the name, 8 bytes big-endian, / 2**64."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") / 2**64


def corpus_folder(tmp_path, rng) -> dict[str, str]:
    """40 .py files of 100 to 1,500 bytes (some non-ASCII) under tmp_path/corpus: {name: text}."""
    files = {}
    for i in range(40):
        text = f"# file {i} ✓\n" + "".join(f"x{j} = {rng.integers(1000)}\n" for j in range(int(rng.integers(8, 140))))
        files[f"pkg{i % 3}/m{i}.py"] = text
        path = tmp_path / "corpus" / f"pkg{i % 3}/m{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return files


def split_texts(data: Text, split: str) -> list[str]:
    """A split's documents: its ids cut at each EOD, decoded (bytes tokenizer)."""
    ids = np.asarray(data.splits[split])
    cuts = [-1, *np.flatnonzero(ids == data.eod)]
    return [bytes(ids[a + 1 : b].astype(np.uint8)).decode() for a, b in zip(cuts, cuts[1:])]


def test_both_splits_hold_whole_long_documents_split_by_the_name_hash(tmp_path):
    files = corpus_folder(tmp_path, np.random.default_rng(SEED))
    kwargs = dict(seq_len=8, batch_size=2, path=str(tmp_path / "corpus"), cache_dir=str(tmp_path / "c"))
    data = Text(**kwargs, eval_fraction=0.4, min_doc_bytes=MIN)
    long = {n: t for n, t in files.items() if len(t.encode()) >= MIN}
    assert 5 < len(long) < 35  # the corpus has documents on both sides of the minimum
    for split in ("train", "eval"):
        want = sorted(t for n, t in long.items() if (name_hash(n) < 0.4) == (split == "eval"))
        assert sorted(split_texts(data, split)) == want and want
    assert not set(split_texts(data, "train")) & set(split_texts(data, "eval"))
    everything = Text(**kwargs, eval_fraction=0.4)  # no minimum: every document, in another cache
    assert len(split_texts(everything, "train") + split_texts(everything, "eval")) == len(files)


def test_the_eval_documents_read_one_by_one_are_the_files(tmp_path):
    files = corpus_folder(tmp_path, np.random.default_rng(SEED))
    source = corpus.FolderSource(str(tmp_path / "corpus"), [".py"], MIN)
    documents = read_documents(source, "eval", 0.4, ByteTokenizer())
    assert [d.name for d in documents] == sorted(
        n for n, t in files.items() if len(t.encode()) >= MIN and name_hash(n) < 0.4
    )
    for d in documents:
        raw = (tmp_path / "corpus" / d.name).read_bytes()
        assert d.sha256 == hashlib.sha256(raw).hexdigest() and d.n_bytes == len(raw) == os.path.getsize(
            tmp_path / "corpus" / d.name
        )
        assert d.ids.tolist() == [*raw, 256]  # the bytes, then EOD
        assert d.record() == {"name": d.name, "bytes": len(raw), "sha256": d.sha256, "ids": len(raw) + 1}


def test_the_rule_keeps_long_enough_documents_in_ascending_name_hash(tmp_path):
    files = corpus_folder(tmp_path, np.random.default_rng(SEED))
    source = corpus.FolderSource(str(tmp_path / "corpus"), None, 0)
    documents = read_documents(source, "eval", 0.6, ByteTokenizer())
    min_ids = 700
    chosen = select_documents(documents, min_ids)
    want = sorted((n for n, t in files.items() if len(t.encode()) + 1 >= min_ids and name_hash(n) < 0.6), key=name_hash)
    assert [d.name for d in chosen] == want and len(want) >= 3
    assert [d.name for d in select_documents(reversed(documents), min_ids, 2)] == want[:2]  # any input order
    assert select_documents(documents, 10**6) == []
    rule = selection_rule(source, 0.6, min_ids, 2)
    assert rule["source"] == str(tmp_path / "corpus") and rule["min_ids"] == min_ids and rule["limit"] == 2
    assert rule["min_doc_bytes"] == 0 and rule["eval_fraction"] == 0.6
    with pytest.raises(ValueError, match="min_ids must be an int >= 1, got 0"):
        select_documents(documents, 0)
    with pytest.raises(ValueError, match="limit must be an int >= 1, got 0"):
        select_documents(documents, 5, 0)


def test_the_long_text_config_splits_the_stdlibs_long_files():
    """data=long_text over the standard library: every eval and training document has at least 65,536 bytes (as
    many tokens under the bytes tokenizer), and no file is in both (names only: no file is read)."""
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=["data=long_text"]))
    assert cfg.data.task == "text" and cfg.data.min_doc_bytes == 65536 and cfg.data.tokenizer == "bytes"
    source = corpus.FolderSource(corpus.default_path(), [".py"], cfg.data.min_doc_bytes)
    evals = [n for n in source.names if corpus.in_eval(n, cfg.data.eval_fraction)]
    train = [n for n in source.names if not corpus.in_eval(n, cfg.data.eval_fraction)]
    sizes = {n: os.path.getsize(os.path.join(source.root, n)) for n in source.names}
    assert len(evals) >= 10 and len(train) >= 3 * len(evals) and not set(evals) & set(train)
    assert min(sizes.values()) >= 65536
    assert len(corpus.FolderSource(corpus.default_path(), [".py"]).names) > 5 * len(source.names)


def test_hf_rows_below_the_minimum_are_left_out(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    rows = [("é" * int(n)) for n in np.random.default_rng(SEED).integers(1, 60, 30)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    source = corpus.HFSource("json", [str(tmp_path / "rows.jsonl")], "text", "train", False, min_doc_bytes=50)
    got = [(name, "".join(pieces)) for name, pieces in source.named_documents("eval", 0.5)]
    assert got == [(str(i), r) for i, r in enumerate(rows) if len(r.encode()) >= 50 and name_hash(str(i)) < 0.5]
    assert source.identity()["min_doc_bytes"] == 50
    assert "min_doc_bytes" not in corpus.HFSource("json", [], "text", "train", False).identity()  # old cache keys


def test_a_bad_minimum_is_named(tmp_path):
    with pytest.raises(ValueError, match="min_doc_bytes must be an int >= 0, got -1"):
        Text(seq_len=8, batch_size=2, path=str(tmp_path), min_doc_bytes=-1, cache_dir=str(tmp_path / "c"))
