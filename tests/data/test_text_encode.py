"""The corpus is tokenised in batches of pieces (one encode_batch call each, never the whole corpus), with the
ids of one encode per piece; a progress line shows a BPE training and each split being tokenised (log lines off
a terminal, a tqdm bar on one), and nothing on a cache hit."""

import io
import logging

import numpy as np
import pytest

from retention.data import Text, corpus, encode, progress
from retention.data.tokenizer import HFTokenizer

SEED = int(np.random.SeedSequence().generate_state(1)[0])


def write_docs(folder, rng, n: int = 40) -> None:
    """n documents of random words, some long enough to be read in several pieces."""
    folder.mkdir(parents=True)
    words = ["power ", "retention ", "héllo ", "✓", "def f(x):\n", "    return x\n", "中文 ", "  "]
    for i in range(n):
        (folder / f"{i}.txt").write_text("".join(rng.choice(words, int(rng.integers(1, 400)))))


def oracle_ids(data: Text, split: str) -> np.ndarray:
    """One encode per text piece of each document of `split` (its pieces as corpus.text_chunks cuts them), EOD
    after each document: the Rust tokenizer called directly, one text at a time."""
    raw, out = data.tokenizer.tokenizer, []
    for pieces in data.source.documents(split, data.eval_fraction):
        out += [i for text in pieces for i in raw.encode(text, add_special_tokens=False).ids] + [data.eod]
    return np.asarray(out)


def test_batched_ids_equal_one_encode_per_piece(tmp_path, monkeypatch):
    rng = np.random.default_rng(SEED)
    write_docs(tmp_path / "docs", rng)
    monkeypatch.setattr(corpus, "CHUNK_BYTES", 97)  # documents in several pieces, characters split across them
    monkeypatch.setattr(encode, "BATCH_BYTES", 1000)  # several batches, a document across two
    batches = []
    encode_batch = HFTokenizer.encode_batch

    def spy(self, texts):
        batches.append([len(t.encode()) for t in texts])
        return encode_batch(self, texts)

    monkeypatch.setattr(HFTokenizer, "encode_batch", spy)
    monkeypatch.setattr(HFTokenizer, "encode", lambda self, text: pytest.fail("one encode per piece"))
    kwargs = dict(seq_len=8, batch_size=2, path=str(tmp_path / "docs"), eval_fraction=0.3, cache_dir=str(tmp_path))
    data = Text(**kwargs, tokenizer="bpe", vocab_size=400)
    for split in ("train", "eval"):
        np.testing.assert_array_equal(data.splits[split], oracle_ids(data, split))
    assert len(batches) > 4 and max(len(b) for b in batches) > 5  # batches of many pieces
    # a piece is a 97-byte chunk plus at most the 3 bytes of a character the chunk before cut (UTF-8: 4 at most)
    assert max(max(b) for b in batches) <= 97 + 3
    assert all(sum(b) < 1000 + 97 + 3 for b in batches)  # bounded: the budget and one piece
    pieces = sum(1 for s in ("train", "eval") for d in data.source.documents(s, 0.3) for _ in d)
    assert sum(len(b) for b in batches) == pieces


def test_progress_lines_while_training_and_tokenising(tmp_path, monkeypatch, caplog):
    write_docs(tmp_path / "docs", np.random.default_rng(SEED))
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)  # a line at every update
    monkeypatch.setattr(encode, "BATCH_BYTES", 2000)
    kwargs = dict(seq_len=8, batch_size=2, path=str(tmp_path / "docs"), eval_fraction=0.3, cache_dir=str(tmp_path))
    with caplog.at_level(logging.INFO, logger=progress.__name__):
        Text(**kwargs, tokenizer="bpe", vocab_size=300)
    lines = [r.getMessage() for r in caplog.records if r.name == progress.__name__]
    train_bytes = corpus.FolderSource(str(tmp_path / "docs")).split_bytes("train", 0.3)
    training = [line for line in lines if line.startswith("training a BPE of 300 ids on the train split: ")]
    assert len(training) > 5 and f"of {train_bytes / 1e6:.1f} MB" in training[0] and " MB in " in training[-1]
    for split in ("train", "eval"):
        said = [line for line in lines if line.startswith(f"tokenizing the {split} split: ")]
        assert len(said) >= 2 and " MB/s" in said[0] and " MB in " in said[-1], said
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=progress.__name__):
        Text(**kwargs, tokenizer="bpe", vocab_size=300)  # a cache hit: nothing to show
    assert not [r for r in caplog.records if r.name == progress.__name__]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_and_a_log_no_frames(caplog):
    screen, ticks = Terminal(), iter(range(100))
    with caplog.at_level(logging.INFO, logger=progress.__name__):
        with progress.Meter("tokenizing the train split", 3_000_000, stream=screen, clock=lambda: next(ticks)) as m:
            m.update(1_000_000)
            m.update(2_000_000)
    assert "tokenizing the train split" in screen.getvalue() and "3.00M/3.00M" in screen.getvalue()
    assert [r.getMessage() for r in caplog.records] == ["tokenizing the train split: 3.0 MB in 1.0 s"]
    log_file, ticks = io.StringIO(), iter(range(0, 1000, 10))
    with caplog.at_level(logging.INFO, logger=progress.__name__):
        with progress.Meter("x", None, stream=log_file, every_s=15, clock=lambda: next(ticks)) as m:
            for _ in range(4):  # at 10, 20, 30 and 40 s
                m.update(5_000_000)
    assert log_file.getvalue() == ""  # no bar frames in a log
    assert [r.getMessage() for r in caplog.records][1:] == [
        "x: 10.0 MB, 0.5 MB/s",  # at 20 s: the first line 15 s or more after the start
        "x: 20.0 MB, 0.5 MB/s",  # at 40 s
        "x: 20.0 MB in 50.0 s",
    ]
