"""The token cache: each split of a corpus tokenised once into a flat file of ids read back as a numpy memmap.

The cache folder is `data.cache_dir`, else $RETENTION_CACHE, else ~/.cache/retention/text: shared by runs, since
a file's name is a hash of everything its ids depend on (the corpus listing with sizes and modification times,
the tokenizer's identity, the split rule). A file is written to a temporary name and renamed when complete, so a
killed run never leaves a half-written cache; the ids are written one piece at a time (retention/data/encode.py
encodes a batch of pieces at once), never held whole.

Beside each file `<name>` lies `<name>.sum.json`: the file's name, its id count, dtype, largest id and blake2b
digest, written after it. Every load reads the file through once and checks it against them and the vocab: a file
that is missing its sum, cut short, changed by one bit, holding an id beyond the vocab or copied with its sum file
from another cache (another corpus's or tokenizer's ids under this name) is never trained on; it is rebuilt from
the source with a warning naming it.
"""

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable

import numpy as np

log = logging.getLogger(__name__)
SPLIT_RULE = "blake2b(name)/2**64 < eval_fraction"  # part of the key: a new rule makes new files
READ_BYTES = 1 << 20  # 1 MiB: the most of a cache file held at once while it is checked (a batch is more)


def default_cache_dir() -> str:
    """$RETENTION_CACHE when set, else ~/.cache/retention/text."""
    return os.environ.get("RETENTION_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "retention", "text")


def cache_key(*parts) -> str:
    """A hex digest of the JSON of `parts`."""
    return hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=16).hexdigest()


def ids_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def sum_path(path: str) -> str:
    """The file beside the cache file at `path` that holds its count, largest id and digest."""
    return f"{path}.sum.json"


def _write_atomically(path: str, write) -> None:
    """Call write(binary file) on a temporary file beside `path`, then rename it to `path`."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is shared
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _write(path: str, pieces: Iterable[np.ndarray], dtype: np.dtype, vocab_size: int) -> None:
    """Write the pieces' ids to `path`, then their sum file; ValueError at an id outside [0, vocab_size)."""
    digest, count, largest = hashlib.blake2b(digest_size=32), 0, -1

    def write(f):
        nonlocal count, largest
        for ids in pieces:
            ids = np.asarray(ids)
            if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
                raise ValueError(f"the tokenizer gave ids in [{ids.min()}, {ids.max()}], beyond its vocab {vocab_size}")
            words = np.ascontiguousarray(ids, dtype)
            f.write(words)  # its buffer, not a copy as bytes
            digest.update(words)
            count, largest = count + ids.size, max(largest, int(ids.max()) if ids.size else -1)

    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_atomically(path, write)
    summary = {"file": os.path.basename(path), "ids": count, "dtype": dtype.name, "largest_id": largest}
    summary["blake2b"] = digest.hexdigest()
    _write_atomically(sum_path(path), lambda f: f.write(json.dumps(summary).encode()))


def damage(path: str, dtype: np.dtype, vocab_size: int) -> str | None:
    """What is wrong with the cache file at `path` (its sum file missing, unreadable or of another file, its size,
    digest or ids other than the sum says, an id beyond the vocab), or None when it is whole."""
    try:
        with open(sum_path(path)) as f:
            summary = json.load(f)
        count, largest, expected = int(summary["ids"]), int(summary["largest_id"]), summary["blake2b"]
        if summary.get("file") != os.path.basename(path):
            return (
                f"its sum file is of {summary.get('file')!r}, not of this file (copied from another cache, or "
                "written before sum files named their cache)"
            )
        if summary["dtype"] != dtype.name:
            return f"it holds {summary['dtype']} ids, expected {dtype.name}"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its sum file {sum_path(path)} is missing or unreadable ({type(e).__name__}: {e})"
    if (size := os.path.getsize(path)) != count * dtype.itemsize:
        return f"it is {size} bytes, its sum file says {count} ids of {dtype.itemsize} bytes"
    if largest >= vocab_size:
        return f"its sum file says its largest id is {largest}, beyond the vocab {vocab_size}"
    digest = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        while chunk := f.read(READ_BYTES):
            digest.update(chunk)
            if chunk and int(np.frombuffer(chunk, dtype).max()) >= vocab_size:
                return f"it holds an id beyond the vocab {vocab_size}"
    if digest.hexdigest() != expected:
        return "its content differs from its blake2b digest"
    return None


def cached_ids(path: str, pieces: Iterable[np.ndarray], dtype: np.dtype, vocab_size: int) -> np.ndarray:
    """The ids at `path` as a read-only memmap [N], each < vocab_size; on a miss, or when the file there is
    damaged (see `damage`: then a warning names it), `pieces` are written there first (atomically)."""
    if os.path.exists(path):
        if (problem := damage(path, dtype, vocab_size)) is None:
            return _open(path, dtype)
        log.warning("the token cache %s is damaged (%s): rebuilding it from the source", path, problem)
    _write(path, pieces, dtype, vocab_size)
    return _open(path, dtype)


def _open(path: str, dtype: np.dtype) -> np.ndarray:
    if os.path.getsize(path) == 0:
        return np.zeros(0, dtype)  # np.memmap refuses an empty file
    return np.memmap(path, dtype=dtype, mode="r")
