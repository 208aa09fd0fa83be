"""Where the windows of a batch start in a packed stream of N ids (a window is L + 1 ids: inputs and targets).

`random`: B offsets in [0, N - L) drawn from the batch's own generator (`rng_for`), independently per batch.
`epochs`: the stream cut into W = (N - 1) // L windows starting at 0, L, 2L, ... (neighbours share one id: the
last target of one is the first input of the next), visited in a seeded permutation per epoch. Batch i reads the
positions i*B .. i*B + B - 1 of the endless walk (epoch 0's order, then epoch 1's, ...), so every id but the last
N - 1 - W*L is a target exactly once per epoch, each epoch in another order, and batch i is a function of
(seed, i) alone: a run resumed at step i reads what an uninterrupted run would, with nothing saved.
"""

import functools

import numpy as np

from retention.data.base import SPLITS, rng_for
from retention.validation import check_int

SAMPLERS = ("random", "epochs")
EPOCH_STREAM = 0x65706F63  # "epoc": sets an epoch's generator apart from every batch's (rng_for)


def random_starts(n_ids: int, seq_len: int, batch_size: int, seed: int, split: str, index: int) -> np.ndarray:
    """Window starts [batch_size] of batch `index` drawn at random from [0, n_ids - seq_len)."""
    return rng_for(seed, split, index, seq_len).integers(0, n_ids - seq_len, size=batch_size)


@functools.lru_cache(maxsize=2)  # the epoch in progress and the next: a batch may straddle them
def epoch_order(seed: int, split: str, n_windows: int, seq_len: int, epoch: int) -> np.ndarray:
    """The windows [n_windows] of `epoch` in the order they are read: a seeded permutation (read-only)."""
    rng = np.random.default_rng([seed, SPLITS[split], seq_len, epoch, EPOCH_STREAM])
    order = rng.permutation(np.arange(n_windows, dtype=np.int32 if n_windows < 2**31 else np.int64))
    order.flags.writeable = False
    return order


def epoch_starts(n_ids: int, seq_len: int, batch_size: int, seed: int, split: str, index: int) -> np.ndarray:
    """Window starts [batch_size] of batch `index` walking the epochs' permutations of the W = (n_ids - 1) //
    seq_len windows at multiples of seq_len."""
    check_int("index", index, low=0)
    n_windows = (n_ids - 1) // seq_len
    positions = index * batch_size + np.arange(batch_size)
    epochs, within = np.divmod(positions, n_windows)
    windows = [epoch_order(seed, split, n_windows, seq_len, int(e))[w] for e, w in zip(epochs, within)]
    return np.asarray(windows, np.int64) * seq_len


def window_starts(sampler: str, n_ids: int, seq_len: int, batch_size: int, seed: int, split: str, index: int):
    """The starts [batch_size] of batch `index` by `sampler` (one of SAMPLERS) in a stream of n_ids >= seq_len + 1."""
    starts = epoch_starts if sampler == "epochs" else random_starts
    return starts(n_ids, seq_len, batch_size, seed, split, index)
