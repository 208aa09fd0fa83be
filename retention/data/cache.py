"""The token cache: each split of a corpus tokenised once into a flat file of ids read back as a numpy memmap.

The cache folder is `data.cache_dir`, else $RETENTION_CACHE, else ~/.cache/retention/text: shared by runs, since
a file's name is a hash of everything its ids depend on (the corpus listing with sizes and modification times,
the tokenizer's identity, the split rule). A file is written to a temporary name and renamed when complete, so a
killed run never leaves a half-written cache; documents are written one piece at a time, never held whole.
"""

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable

import numpy as np

SPLIT_RULE = "blake2b(name)/2**64 < eval_fraction"  # part of the key: a new rule makes new files


def default_cache_dir() -> str:
    """$RETENTION_CACHE when set, else ~/.cache/retention/text."""
    return os.environ.get("RETENTION_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "retention", "text")


def cache_key(*parts) -> str:
    """A hex digest of the JSON of `parts`."""
    return hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=16).hexdigest()


def ids_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def cached_ids(path: str, pieces: Iterable[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """The ids at `path` as a read-only memmap [N]; on a miss, `pieces` are written there first (atomically)."""
    if not os.path.exists(path):
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                for ids in pieces:
                    f.write(np.ascontiguousarray(ids, dtype))  # its buffer, not a copy as bytes
            os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is shared
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    if os.path.getsize(path) == 0:
        return np.zeros(0, dtype)  # np.memmap refuses an empty file
    return np.memmap(path, dtype=dtype, mode="r")
