"""The token cache is never trained on unchecked: a flipped bit, a file cut short (to 200 bytes, or by one
byte), a missing sum file, an id beyond the vocab or a whole cache copied from another corpus is caught on load,
named in a warning, and the file is rebuilt from the source with the ids a fresh build gives; a folder's files
that are not text are counted and named, never dropped without a word."""

import json
import logging
import os
import shutil

import numpy as np
import pytest

from retention.data import Text, corpus
from retention.data import cache as text_cache

SEED = int(np.random.SeedSequence().generate_state(1)[0])


def make_corpus(folder, rng) -> None:
    """30 small documents of random words, some with non-ASCII characters."""
    folder.mkdir(parents=True)
    words = ["alpha", "beta", "γάμμα", "delta", "ε✓", "zeta", "eta"]
    for i in range(30):
        (folder / f"{i}.txt").write_text(" ".join(rng.choice(words, size=int(rng.integers(20, 60)))))


def flip_bit(path, rng) -> None:
    raw = bytearray(open(path, "rb").read())
    raw[rng.integers(len(raw))] ^= 1 << int(rng.integers(8))
    open(path, "wb").write(bytes(raw))


def cut_to(size):
    def cut(path, rng):
        with open(path, "r+b") as f:
            f.truncate(size if size >= 0 else os.path.getsize(path) + size)

    return cut


def drop_sum(path, rng):
    os.remove(text_cache.sum_path(path))


@pytest.mark.parametrize("damage", [flip_bit, cut_to(200), cut_to(-1), drop_sum], ids=["bit", "200", "-1", "sum"])
def test_a_damaged_cache_is_named_and_rebuilt(tmp_path, caplog, damage):
    rng = np.random.default_rng(SEED)
    make_corpus(tmp_path / "docs", rng)
    kwargs = dict(seq_len=8, batch_size=2, path=str(tmp_path / "docs"), eval_fraction=0.3, cache_dir=str(tmp_path))
    fresh = {split: np.array(ids) for split, ids in Text(**kwargs).splits.items()}
    (path,) = [str(tmp_path / f) for f in os.listdir(tmp_path) if f.endswith(".train.uint16")]
    damage(path, rng)
    with caplog.at_level(logging.WARNING):
        again = Text(**kwargs)
    assert f"the token cache {path} is damaged" in caplog.text and "rebuilding it from the source" in caplog.text
    for split, ids in fresh.items():
        np.testing.assert_array_equal(again.splits[split], ids)
    assert text_cache.damage(path, np.dtype(np.uint16), 257) is None  # whole again, with its sum


def test_ids_beyond_the_vocab_are_refused(tmp_path, caplog):
    path = str(tmp_path / "key.train.uint16")
    ids = np.random.default_rng(SEED).integers(0, 301, 1000)
    ids[17] = 300
    text_cache.cached_ids(path, iter([ids]), np.dtype(np.uint16), 301)
    assert text_cache.damage(path, np.dtype(np.uint16), 300) == (
        "its sum file says its largest id is 300, beyond the vocab 300"
    )
    summary = json.load(open(text_cache.sum_path(path)))
    json.dump({**summary, "largest_id": 5}, open(text_cache.sum_path(path), "w"))  # a sum file that lies
    assert text_cache.damage(path, np.dtype(np.uint16), 300) == "it holds an id beyond the vocab 300"
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(ValueError, match=r"ids in \[\d+, 300\], beyond its vocab 300"),
    ):
        text_cache.cached_ids(path, iter([ids]), np.dtype(np.uint16), 300)  # rebuilt: the source's ids are bad too
    assert f"the token cache {path} is damaged" in caplog.text


def test_files_that_are_not_text_are_counted_and_named(tmp_path, caplog):
    folder = tmp_path / "docs"
    make_corpus(folder, np.random.default_rng(SEED))
    bad = {"latin1.txt": "'utf-8' codec can't decode byte 0xe9", "blob.txt": "holds a NUL byte"}
    (folder / "latin1.txt").write_bytes("café résumé".encode("latin-1"))
    (folder / "blob.txt").write_bytes(b"\x00\x01binary\x00")
    with caplog.at_level(logging.WARNING):
        Text(seq_len=8, batch_size=2, path=str(folder), eval_fraction=0.3, cache_dir=str(tmp_path / "c"))
    lines = {r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped")}
    for split in ("train", "eval"):
        names = [n for n in os.listdir(folder) if corpus.in_eval(n, 0.3) == (split == "eval")]
        skipped = [n for n in bad if n in names]
        said = [line for line in lines if f"files of the {split} split under {folder}" in line]
        if not skipped:
            assert not said
            continue
        (line,) = said
        assert line.startswith(f"skipped {len(skipped)} of the {len(names)} files of the {split} split"), line
        assert all(f"{n} ({bad[n]}" in line for n in skipped), line


def test_a_cache_copied_from_another_corpus_is_named_and_rebuilt(tmp_path, caplog):
    """A cache file and its sum file, both whole, copied over this corpus's (another corpus's ids under this name)
    are not this cache: named in a warning and rebuilt."""
    rng = np.random.default_rng(SEED)
    make_corpus(tmp_path / "docs", rng)
    make_corpus(tmp_path / "other", rng)
    kwargs = dict(seq_len=8, batch_size=2, eval_fraction=0.3, cache_dir=str(tmp_path / "cache"))
    fresh = np.array(Text(path=str(tmp_path / "docs"), **kwargs).splits["train"])
    before = set(os.listdir(tmp_path / "cache"))
    Text(path=str(tmp_path / "other"), **kwargs)
    (mine,) = [f for f in before if f.endswith(".train.uint16")]
    (theirs,) = [f for f in set(os.listdir(tmp_path / "cache")) - before if f.endswith(".train.uint16")]
    for name in (theirs, text_cache.sum_path(theirs)):
        shutil.copyfile(tmp_path / "cache" / name, tmp_path / "cache" / name.replace(theirs, mine))
    with caplog.at_level(logging.WARNING):
        again = Text(path=str(tmp_path / "docs"), **kwargs)
    path = str(tmp_path / "cache" / mine)
    assert f"the token cache {path} is damaged" in caplog.text and f"{theirs}" in caplog.text
    np.testing.assert_array_equal(again.splits["train"], fresh)
