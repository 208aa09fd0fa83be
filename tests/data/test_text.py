"""Text data: only text files are documents, the split is by a stable hash of the name, the token cache is
written once and atomically, windows are slices of the stream packed with segment ids and cross-document masks."""

import os

import numpy as np
import pytest

from retention.data import IGNORE, Text, corpus
from retention.data import cache as text_cache
from retention.data.packing import mask_cross_document_targets, pack_windows, segment_ids_from_eod

SEED = int(np.random.SeedSequence().generate_state(1)[0])


def documents(data: Text, split: str) -> list[str]:
    """The documents of a split: its ids cut at each EOD, decoded."""
    ids = np.asarray(data.splits[split])
    cuts = np.flatnonzero(ids == data.eod)
    assert len(ids) == 0 or cuts[-1] == len(ids) - 1  # every document ends with EOD
    return [
        bytes(ids[a + 1 if i else 0 : b].astype(np.uint8)).decode() for i, (a, b) in enumerate(zip([0, *cuts], cuts))
    ]


def write(folder, files: dict) -> None:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def test_only_text_files_are_documents(tmp_path, monkeypatch):
    """A binary file, invalid UTF-8, a NUL byte, __pycache__ and hidden files drop out; text of any extension
    stays, read in small chunks so a character straddles a chunk boundary."""
    rng = np.random.default_rng(SEED)
    text = {f"t{i}.{ext}": f"héllo wörld {i} ✓ " * 7 for i, ext in enumerate(["py", "txt", "md", "cfg"] * 5)}
    text["noext"] = "plain text without an extension ✓"
    binary = {
        "lib.so": rng.integers(0, 256, 4000, dtype=np.uint8).tobytes(),
        "bad.txt": b"abc" + b"\xff\xfe" + b"def",  # invalid UTF-8
        "nul.py": b"print(1)\n" + b"\0" + b"print(2)\n",  # valid UTF-8 with a NUL byte
        "cut.txt": "abc✓".encode()[:-1],  # a character cut short at the end
        "__pycache__/m.cpython-312.pyc": "x = 1",
        ".hidden.py": "x = 1",
    }
    write(tmp_path, {**text, **binary})
    monkeypatch.setattr(corpus, "CHUNK_BYTES", 5)  # multi-byte characters straddle chunks
    data = Text(seq_len=8, batch_size=2, path=str(tmp_path), eval_fraction=0.3, cache_dir=str(tmp_path / "c"))
    got = documents(data, "train") + documents(data, "eval")
    assert sorted(got) == sorted(text.values())
    assert documents(data, "eval") and documents(data, "train")
    only_py = Text(
        seq_len=8,
        batch_size=2,
        path=str(tmp_path),
        extensions=[".py"],
        eval_fraction=0.3,
        cache_dir=str(tmp_path / "c"),
    )
    assert sorted(documents(only_py, "train") + documents(only_py, "eval")) == sorted(
        v for k, v in text.items() if k.endswith(".py")
    )


def test_split_is_stable_under_renames_and_additions(tmp_path):
    files = {f"d/{i}.py": f"document {i}\n" * 3 for i in range(80)}
    root = tmp_path / "corpus"  # the cache beside it, not in it (its sum files are text)
    write(root, files)
    kwargs = dict(seq_len=4, batch_size=2, path=str(root), eval_fraction=0.25, cache_dir=str(tmp_path / "c"))
    before = Text(**kwargs)
    (root / "d/0.py").rename(root / "d/renamed.py")
    (root / "d/1.py").rename(root / "moved.py")
    write(root, {f"new/{i}.py": f"new document {i}\n" for i in range(30)})
    after = Text(**kwargs)
    moved = {files["d/0.py"], files["d/1.py"]}
    for split in ("train", "eval"):
        old = set(documents(before, split)) - moved
        new = set(documents(after, split)) - moved
        assert new - {f"new document {i}\n" for i in range(30)} == old
    assert 5 <= len(documents(before, "eval")) <= 40  # about a quarter of 80


def test_default_corpus_is_stdlib_python_sources(tmp_path):
    source = corpus.FolderSource(corpus.default_path(), [".py"])
    names = source.names
    assert "os.py" in names and all(n.endswith(".py") for n in names)
    assert not any(part in n.split("/") for n in names for part in ("site-packages", "__pycache__"))


def test_cache_is_reused_and_keyed_by_the_listing(tmp_path):
    write(tmp_path / "docs", {f"{i}.txt": f"text {i} " * 20 for i in range(30)})
    kwargs = dict(seq_len=8, batch_size=2, path=str(tmp_path / "docs"), eval_fraction=0.3)
    first = Text(**kwargs, cache_dir=str(tmp_path / "c"))
    files = sorted(f for f in os.listdir(tmp_path / "c") if not f.endswith(".sum.json"))
    assert len(files) == 2 and all(f.endswith(".uint16") for f in files)
    assert sorted(os.listdir(tmp_path / "c")) == sorted([*files, *(text_cache.sum_path(f) for f in files)])
    assert isinstance(first.splits["train"], np.memmap)
    stamps = [os.stat(tmp_path / "c" / f).st_mtime_ns for f in files]
    again = Text(**kwargs, cache_dir=str(tmp_path / "c"))
    assert [os.stat(tmp_path / "c" / f).st_mtime_ns for f in files] == stamps  # read, not rewritten
    np.testing.assert_array_equal(again.splits["train"], first.splits["train"])
    (tmp_path / "docs" / "0.txt").write_text("changed")
    Text(**kwargs, cache_dir=str(tmp_path / "c"))
    assert len(os.listdir(tmp_path / "c")) == 8  # a changed file is a new key (2 files and their sums)


def test_killed_write_leaves_no_cache(tmp_path):
    def pieces():
        yield np.arange(10)
        raise KeyboardInterrupt  # killed half-way

    path = str(tmp_path / "c" / "key.train.uint16")
    with pytest.raises(KeyboardInterrupt):
        text_cache.cached_ids(path, pieces(), np.dtype(np.uint16), 257)
    assert os.listdir(tmp_path / "c") == []
    ids = text_cache.cached_ids(path, iter([np.arange(3), np.arange(2)]), np.dtype(np.uint16), 257)
    np.testing.assert_array_equal(ids, [0, 1, 2, 0, 1])


def test_windows_are_slices_of_the_stream(tmp_path):
    rng = np.random.default_rng(SEED)
    write(tmp_path, {f"{i}.txt": "".join(rng.choice(list("ab c✓\n"), int(rng.integers(1, 40)))) for i in range(60)})
    data = Text(seq_len=24, batch_size=6, path=str(tmp_path), eval_fraction=0.3, cache_dir=str(tmp_path / "c"))
    for split in ("train", "eval"):
        ids = np.asarray(data.splits[split]).astype(np.int32)
        b = data.batch(3, split=split)
        assert b.inputs.dtype == b.targets.dtype == b.segment_ids.dtype == np.int32
        for x, y in zip(b.inputs, b.targets):
            starts = [s for s in range(len(ids) - 24) if np.array_equal(ids[s : s + 24], x)]
            assert starts and any(ids[s + 24] == y[-1] or y[-1] == IGNORE for s in starts)
            keep = x != data.eod
            np.testing.assert_array_equal(y[:-1][keep[:-1]], x[1:][keep[:-1]])
            assert np.all(y[~keep] == IGNORE)
        np.testing.assert_array_equal(data.batch(3, split=split).inputs, b.inputs)  # seeded


def test_packing_matches_a_loop_oracle():
    """segment_ids[t] = EODs in inputs[:t]; a target after an EOD is IGNORE; one predicting EOD is kept."""
    rng = np.random.default_rng(SEED)
    eod = 7
    for B, T in ((3, 1), (4, 13), (2, 64)):
        windows = rng.integers(0, 8, size=(B, T + 1))  # EOD about one id in eight: several per window
        windows[0, :3] = eod  # EODs in a row
        windows[-1, -2:] = [0, eod]  # a document's last token predicts its end
        batch = pack_windows(windows, eod)
        for b in range(B):
            count = 0
            for t in range(T):
                assert batch.inputs[b, t] == windows[b, t]
                assert batch.segment_ids[b, t] == count
                expected = IGNORE if windows[b, t] == eod else windows[b, t + 1]
                assert batch.targets[b, t] == expected
                count += int(windows[b, t] == eod)
        assert np.any(batch.targets == eod)  # predicting a document's end is kept
        np.testing.assert_array_equal(segment_ids_from_eod(batch.inputs, eod), batch.segment_ids)
        np.testing.assert_array_equal(mask_cross_document_targets(batch.inputs, windows[:, 1:], eod), batch.targets)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(source="web"), r"source must be one of \('folder', 'hf'\), got 'web'"),
        (dict(tokenizer="words"), r"tokenizer must be one of \('bytes', 'bpe', 'file'\), got 'words'"),
        (dict(sampler="shuffle"), r"sampler must be one of \('random', 'epochs'\), got 'shuffle'"),
        (dict(eod_token="</s>"), r"eod_token must be <\|endofdocument\|> with tokenizer=bytes .*, got '</s>'"),
        (dict(tokenizer="bpe", eod_token=""), "eod_token must be a token of the tokenizer's vocab .*, got ''"),
        (dict(tokenizer_file="t.json"), "tokenizer_file is for tokenizer=file, got 't.json' with tokenizer=bytes"),
        (dict(tokenizer="file"), "tokenizer_file must be the path of a tokenizer.json file, got None"),
        (dict(tokenizer="file", tokenizer_file="no.json"), "tokenizer_file must be the path .*, got 'no.json'"),
        (dict(tokenizer="file", vocab_size=300), "vocab_size must be null with tokenizer=file"),
        (dict(vocab_size=1000), "vocab_size must be null or 257 with tokenizer=bytes"),
        (dict(tokenizer="bpe", vocab_size=100), "vocab_size must be an int >= 257"),
        (dict(extensions=["py", 3]), "extensions must be a list of name endings"),
        (dict(extensions=[]), "extensions must be a list of name endings"),
        (dict(hf_name="json"), "hf_name and hf_data_files are for source=hf"),
        (dict(source="hf", path=None), "hf_name must name a Hugging Face dataset"),
        (dict(source="hf", hf_name="json"), "path and extensions are for source=folder"),
        (dict(source="hf", path=None, hf_name="json", hf_text_field=""), "hf_text_field must name the column"),
        (dict(eval_fraction=0.0), r"eval_fraction must be a finite number in \(0, 1\)"),
    ],
)
def test_bad_arguments_are_named(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        Text(seq_len=8, batch_size=2, **{"path": str(tmp_path), "cache_dir": str(tmp_path / "c"), **kwargs})


def test_a_split_too_small_is_named(tmp_path):
    write(tmp_path, {f"{i}.txt": "ab" for i in range(20)})
    with pytest.raises(ValueError, match=r"seq_len must be < the ids in each split"):
        Text(seq_len=100, batch_size=2, path=str(tmp_path), eval_fraction=0.5, cache_dir=str(tmp_path / "c"))
