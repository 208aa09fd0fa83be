"""Byte-level text: every file under a folder, as one stream of byte ids with a separator between files.

Ids 0..255 are bytes and SEP = 256 ends each file (vocab 257). The files are read in sorted path order (cache
folders `__pycache__` and hidden entries skipped); the last `eval_fraction` of the stream is the eval split.
A batch holds windows of seq_len + 1 ids at random offsets: inputs the first seq_len, targets the last seq_len.
The default folder is the running Python's standard library source (`sysconfig.get_paths()["stdlib"]`).
"""

import os
import sysconfig

import numpy as np

from retention.data.base import Batch, rng_for
from retention.validation import check_int, check_number

SEP = 256
VOCAB_SIZE = 257


def encode(data: bytes) -> np.ndarray:
    """Byte ids [len(data)] (uint16) of `data`."""
    return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)


def decode(ids) -> bytes:
    """The bytes of a sequence of ids, each SEP written as a newline."""
    ids = np.asarray(ids)
    return np.where(ids == SEP, ord("\n"), ids).astype(np.uint8).tobytes()


def default_path() -> str:
    """The standard library's source folder of the running Python."""
    return sysconfig.get_paths()["stdlib"]


def list_files(root: str) -> list[str]:
    """Every regular file under `root` in sorted order, skipping `__pycache__` and hidden entries."""
    paths = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [s for s in subfolders if s != "__pycache__" and not s.startswith(".")]
        paths += [os.path.join(folder, n) for n in names if not n.startswith(".")]
    return sorted(p for p in paths if os.path.isfile(p) and not os.path.islink(p))


def read_stream(root: str) -> np.ndarray:
    """The ids [N] (uint16) of every file under `root`, each followed by SEP."""
    pieces = []
    for path in list_files(root):
        with open(path, "rb") as f:
            pieces += [encode(f.read()), np.array([SEP], np.uint16)]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.uint16)


class Text:
    """Byte-level windows [batch_size, seq_len] from the files under `path` (default: the stdlib source)."""

    vocab_size = VOCAB_SIZE

    def __init__(
        self, *, seq_len: int, batch_size: int, path: str | None = None, eval_fraction: float = 0.05, seed: int = 0
    ):
        check_int("seq_len", seq_len)
        check_int("batch_size", batch_size)
        self.path = default_path() if path is None else path
        if not os.path.isdir(self.path):
            raise ValueError(f"path must be a folder of text files, got {self.path!r} (not a folder)")
        check_number("eval_fraction", eval_fraction, low=0, high=1, open_low=True, open_high=True)
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        stream = read_stream(self.path)
        cut = len(stream) - int(len(stream) * eval_fraction)
        self.splits = {"train": stream[:cut], "eval": stream[cut:]}
        self.check_length("seq_len", seq_len)

    def check_length(self, name: str, seq_len: int) -> None:
        """Each split must hold a window of seq_len + 1 ids."""
        check_int(name, seq_len)
        sizes = {split: len(ids) for split, ids in self.splits.items()}
        if min(sizes.values()) < seq_len + 1:
            raise ValueError(f"{name} must be < the ids in each split of {self.path!r} ({sizes}), got {seq_len}")

    def batch(self, index: int, *, seq_len: int | None = None, split: str = "train") -> Batch:
        """Batch `index` of `split`: windows at random offsets, inputs [B, T] and next-byte targets [B, T]."""
        L = self.seq_len if seq_len is None else seq_len
        self.check_length("seq_len", L)
        rng = rng_for(self.seed, split, index, L)
        ids = self.splits[split]
        starts_B = rng.integers(0, len(ids) - L, size=self.batch_size)
        windows_BL1 = ids[starts_B[:, None] + np.arange(L + 1)].astype(np.int32)
        return Batch(windows_BL1[:, :-1], windows_BL1[:, 1:])
