"""data.sampler=epochs: the training windows walk a seeded permutation of the packed stream per epoch, every
window once per epoch, each epoch in another order, eval windows as before; batch i is a function of (seed, i),
so a run resumed at a step (the trainer's prefetch from `start`, a fresh process) reads the tokens of an
uninterrupted run; the default sampler draws the windows it always drew."""

import collections

import numpy as np
import pytest

from retention.data import IGNORE, Text, prefetch, sampler
from retention.data.base import rng_for

SEED = int(np.random.SeedSequence().generate_state(1)[0])


def corpus(tmp_path, rng) -> dict:
    """Text kwargs over 30 documents of random characters (a few thousand bytes)."""
    (tmp_path / "docs").mkdir()
    for i in range(30):
        chars = rng.choice(list("abcdefghij klmnop✓é\n"), int(rng.integers(20, 200)))
        (tmp_path / "docs" / f"{i}.txt").write_text("".join(chars))
    return corpus_kwargs(tmp_path)


@pytest.mark.parametrize("L, B", [(13, 7), (32, 5)])
def test_every_window_once_per_epoch(tmp_path, L, B):
    kwargs = corpus(tmp_path, np.random.default_rng([SEED, L]))
    ids = np.asarray(Text(seq_len=L, batch_size=B, **kwargs).splits["train"]).astype(np.int64)
    W = (len(ids) - 1) // L
    while W % B == 0:  # batches straddle the epochs
        B += 1
    data = Text(seq_len=L, batch_size=B, sampler="epochs", **kwargs)
    # each window of the stream as a batch row shows it: its L inputs, then its last target (IGNORE after an EOD)
    windows = [
        (*ids[k * L : k * L + L], IGNORE if ids[k * L + L - 1] == data.eod else ids[k * L + L]) for k in range(W)
    ]
    rows = []
    for i in range(-(-3 * W // B)):  # three epochs
        batch = data.batch(i)
        rows += [(*x, y[-1]) for x, y in zip(batch.inputs.tolist(), batch.targets.tolist())]
    epochs = [rows[e * W : (e + 1) * W] for e in range(3)]
    for got in epochs:  # every window once
        assert collections.Counter(got) == collections.Counter(tuple(int(v) for v in w) for w in windows)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]  # another order each epoch
    order = np.concatenate([sampler.epoch_starts(len(ids), L, B, SEED, "train", i) for i in range(-(-2 * W // B))])
    assert np.all(order % L == 0)
    assert sorted(order[:W] // L) == list(range(W)) and sorted(order[W : 2 * W] // L) == list(range(W))
    default = Text(seq_len=L, batch_size=B, **corpus_kwargs(tmp_path))  # eval windows: as the default sampler's
    np.testing.assert_array_equal(default.batch(2, split="eval").inputs, data.batch(2, split="eval").inputs)


def corpus_kwargs(tmp_path) -> dict:
    return dict(path=str(tmp_path / "docs"), eval_fraction=0.3, cache_dir=str(tmp_path / "c"), seed=SEED)


def test_a_resume_reads_the_tokens_of_an_uninterrupted_run(tmp_path):
    """The trainer reads batches start, start + 1, ... through prefetch; a resumed process (a fresh Text, the
    permutation cache empty) at step k reads what the uninterrupted run read from step k."""
    kwargs = dict(seq_len=11, batch_size=6, sampler="epochs", **corpus(tmp_path, np.random.default_rng(SEED)))
    steps = -(-3 * (len(Text(**kwargs).splits["train"]) - 1) // 11 // 6)  # three epochs
    sampler.epoch_order.cache_clear()
    uninterrupted = list(prefetch(Text(**kwargs).batch, 0, steps))
    for k in (1, steps // 3, steps // 2 + 1, steps - 1):
        sampler.epoch_order.cache_clear()
        resumed = list(prefetch(Text(**kwargs).batch, k, steps))
        for a, b in zip(uninterrupted[k:], resumed, strict=True):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)


def test_the_default_sampler_is_unchanged(tmp_path):
    """sampler=random: the starts rng_for(seed, split, index, seq_len) draws, as before the option."""
    data = Text(seq_len=9, batch_size=4, **corpus(tmp_path, np.random.default_rng(SEED)))
    for split in ("train", "eval"):
        ids = np.asarray(data.splits[split]).astype(np.int32)
        starts = rng_for(SEED, split, 5, 9).integers(0, len(ids) - 9, size=4)
        np.testing.assert_array_equal(data.batch(5, split=split).inputs, np.stack([ids[s : s + 9] for s in starts]))
