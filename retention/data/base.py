"""What every data generator shares: the batch type, the ignore label and seeded streams.

A generator maps (split, index) to one batch, deterministically from its seed: batch `i` of the training stream
is the same on every run, so a run resumed at step `i` sees the data an uninterrupted run would have seen.
"""

from typing import NamedTuple, Protocol

import numpy as np

from retention.validation import check_choice, check_int

IGNORE = -100  # the target of a position that carries no loss
SPLITS = {"train": 0, "eval": 1}


class Batch(NamedTuple):
    """inputs [B, T] int32 token ids; targets [B, T] int32, the id to predict at each position or IGNORE;
    segment_ids [B, T] int32, the document of each position in a packed text window (retention/data/packing.py),
    None for the synthetic tasks (one sequence per row)."""

    inputs: np.ndarray
    targets: np.ndarray
    segment_ids: np.ndarray | None = None


class Dataset(Protocol):
    """A seeded source of batches: `batch(index, seq_len=None, split="train")` with vocab_size ids;
    `check_length(name, seq_len)` raises ValueError naming `name` when it cannot make batches that long."""

    vocab_size: int
    seq_len: int
    batch_size: int

    def check_length(self, name: str, seq_len: int) -> None: ...

    def batch(self, index: int, *, seq_len: int | None = None, split: str = "train") -> Batch: ...


def rng_for(seed: int, split: str, index: int, seq_len: int) -> np.random.Generator:
    """The generator of batch `index` of `split` at length `seq_len`: independent of every other batch."""
    check_choice("split", split, SPLITS)
    check_int("index", index, low=0)
    return np.random.default_rng([seed, SPLITS[split], int(index), seq_len])
