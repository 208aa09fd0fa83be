"""Text documents from a folder or a Hugging Face dataset, and the stable train/eval split by document.

Folder: every regular file under the root (hidden entries, `__pycache__`, `site-packages` and `dist-packages`
skipped) whose name ends with one of `extensions` (None: any extension, `.py`, `.txt`, `.md`, none at all) and
whose content is text: valid UTF-8 with no NUL byte, so `.pyc`, `.so`, `.a`, `.whl`, `.exe`, `.png`, `.gz` and
other binaries drop out by their bytes, not their names (a warning counts them, naming the first few and why).
The default corpus is the `.py` sources of the running Python's standard library (`sysconfig.get_paths()["stdlib"]`,
third-party packages left out). A file is read in chunks of CHUNK_BYTES, never whole.

Hugging Face: `datasets.load_dataset(name, data_files=..., split=..., streaming=...)` and one document per row
(its `text_field`); for the `text` builder a whole file is one document (`sample_by="document"`). A local glob
pattern in data_files counts as the files it matches (their names, sizes and times in the cache key, their bytes
in the fingerprint), so a file added under it is never served from an older cache.

Long documents: with `min_doc_bytes` > 0 a source holds only the documents of at least that many bytes (a file's
size; a row's text as UTF-8), so both splits hold whole long documents (the `long_text` data config).

Split: a document is in eval when blake2b(its name) / 2**64 < eval_fraction (`split_hash`), its name being the path
relative to the root (folder) or the row index (Hugging Face); renaming or adding other documents never moves it.
"""

import codecs
import glob
import hashlib
import logging
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from retention.data.cache import cache_key
from retention.data.progress import utf8_bytes

CHUNK_BYTES = 1 << 22  # 4 MiB: the most of a file held in memory at once
SKIPPED_FOLDERS = {"__pycache__", "site-packages", "dist-packages"}
SKIPS_NAMED = 5  # the skipped files a warning names (it counts them all)
log = logging.getLogger(__name__)


def default_path() -> str:
    """The standard library's source folder of the running Python."""
    return sysconfig.get_paths()["stdlib"]


def split_hash(name: str) -> float:
    """The split's hash of the document called `name`: blake2b(name) / 2**64, a stable number in [0, 1)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") / 2**64


def in_eval(name: str, eval_fraction: float) -> bool:
    """Whether the document called `name` is in the eval split: a stable hash of its name below eval_fraction."""
    return split_hash(name) < eval_fraction


def text_chunks(path: str) -> Iterator[str]:
    """The text of the file at `path` in pieces of at most CHUNK_BYTES + 3 bytes (a character cut at a chunk's end
    opens the next piece); raises ValueError at a NUL byte or bytes that are not UTF-8 (so a consumer stops before
    using a binary file's rest)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            if b"\0" in chunk:
                raise ValueError(f"{path} holds a NUL byte")
            yield decoder.decode(chunk)  # UnicodeDecodeError (a ValueError) at invalid UTF-8
        yield decoder.decode(b"", final=True)


def not_text(path: str) -> str | None:
    """Why the file at `path` is not a text document (a NUL byte, bytes that are not UTF-8 such as latin-1), or
    None when it is valid UTF-8 without a NUL byte (read in chunks)."""
    try:
        for _ in text_chunks(path):
            pass
    except ValueError as e:
        return str(e).replace(f"{path} ", "")
    return None


def files_digest(root: str, names: list[str]) -> str:
    """blake2b of the names and bytes of the files `names` under `root`, read in chunks: what a text run's
    record keeps of its corpus, so a resume on rewritten files is refused whatever their modification times."""
    digest = hashlib.blake2b(digest_size=16)
    for name in names:
        digest.update(f"{name}\0{os.path.getsize(os.path.join(root, name))}\0".encode())
        with open(os.path.join(root, name), "rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                digest.update(chunk)
    return digest.hexdigest()


class FolderSource:
    """The text files under `root` whose names end with one of `extensions` (None: all) of at least
    `min_doc_bytes` bytes."""

    def __init__(self, root: str, extensions: list[str] | None = None, min_doc_bytes: int = 0):
        if not os.path.isdir(root):
            raise ValueError(f"path must be a folder of text files, got {root!r} (not a folder)")
        self.root, self.extensions = root, None if extensions is None else tuple(extensions)
        self.min_doc_bytes = min_doc_bytes
        self.names = self.files()  # listed once: the cache key and the documents read are the same files

    def files(self) -> list[str]:
        """The candidate files' paths relative to the root (POSIX separators), sorted; not yet checked for text.
        A file under min_doc_bytes is no candidate (so the listing, and with it the cache key, names none)."""
        names = []
        for folder, subfolders, files in os.walk(self.root):
            subfolders[:] = [s for s in subfolders if s not in SKIPPED_FOLDERS and not s.startswith(".")]
            for name in files:
                path = os.path.join(folder, name)
                if name.startswith(".") or not os.path.isfile(path) or os.path.islink(path):
                    continue
                if (self.extensions is None or name.endswith(self.extensions)) and (
                    os.path.getsize(path) >= self.min_doc_bytes
                ):
                    names.append(Path(os.path.relpath(path, self.root)).as_posix())
        return sorted(names)

    def identity(self) -> dict:
        """What the cache key hashes: the root and each candidate's name, size and modification time."""
        listing = []
        for name in self.names:
            st = os.stat(os.path.join(self.root, name))
            listing.append([name, st.st_size, st.st_mtime_ns])
        return {"source": "folder", "root": os.path.abspath(self.root), "files": listing}

    def content_digest(self) -> str:
        """The digest of every candidate file's name and bytes (files_digest)."""
        return files_digest(self.root, self.names)

    def split_bytes(self, split: str, eval_fraction: float) -> int:
        """The bytes of the candidate files of `split` (for a progress line's total)."""
        names = [n for n in self.names if in_eval(n, eval_fraction) == (split == "eval")]
        return sum(os.path.getsize(os.path.join(self.root, n)) for n in names)

    def documents(self, split: str, eval_fraction: float) -> Iterator[Iterator[str]]:
        """Each text document of `split` as an iterator of its text pieces, in sorted name order (see
        `named_documents`)."""
        return (pieces for _, pieces in self.named_documents(split, eval_fraction))

    def named_documents(self, split: str, eval_fraction: float) -> Iterator[tuple[str, Iterator[str]]]:
        """(name, an iterator of its text pieces) of each text document of `split`, in sorted name order; once all
        are read, a warning counts the files skipped as not text and names the first SKIPS_NAMED with the reason."""
        skipped, candidates = [], 0
        for name in self.names:
            path = os.path.join(self.root, name)
            if in_eval(name, eval_fraction) != (split == "eval"):
                continue
            candidates += 1
            if (problem := not_text(path)) is None:
                yield name, text_chunks(path)
            else:
                skipped.append(f"{name} ({problem})")
        if skipped:
            more = f" and {len(skipped) - SKIPS_NAMED} more" if len(skipped) > SKIPS_NAMED else ""
            log.warning(
                "skipped %d of the %d files of the %s split under %s: not UTF-8 text without NUL bytes (binary, "
                "latin-1, ...): %s%s",
                *(len(skipped), candidates, split, self.root, "; ".join(skipped[:SKIPS_NAMED]), more),
            )


class HFSource:
    """The rows of a Hugging Face dataset: `load_dataset(name, data_files=..., split=..., streaming=...)`, those
    whose text has at least `min_doc_bytes` bytes."""

    def __init__(self, name: str, data_files, text_field: str, split: str, streaming: bool, min_doc_bytes: int = 0):
        self.name, self.data_files, self.text_field = name, data_files, text_field
        self.split, self.streaming, self.min_doc_bytes = split, streaming, min_doc_bytes

    def patterns(self) -> list[str]:
        """data_files as a list: file paths, glob patterns or remote names."""
        return [self.data_files] if isinstance(self.data_files, str) else list(self.data_files or [])

    def local_files(self, pattern: str) -> list[str]:
        """The local files `pattern` names: itself when a file, the sorted matches of a glob pattern (`**` for
        any depth), none for a remote name."""
        if os.path.isfile(pattern):
            return [pattern]
        matches = glob.glob(pattern, recursive=True) if glob.has_magic(pattern) else []
        return sorted(m for m in matches if os.path.isfile(m))

    def identity(self) -> dict:
        """The load_dataset arguments, with the size and modification time of each local data file: a glob
        pattern's matches listed, so a file added, removed or changed under it makes another identity."""
        stats = []
        for f in self.patterns():
            listing = [[m, os.stat(m).st_size, os.stat(m).st_mtime_ns] for m in self.local_files(f)]
            stats.append(listing[0] if os.path.isfile(f) else [f, listing] if glob.has_magic(f) else [f])
        identity = {
            "source": "hf",
            "name": self.name,
            "data_files": stats,
            "text_field": self.text_field,
            "split": self.split,
        }
        if self.min_doc_bytes:  # only when set: the caches made before the option keep their names
            identity["min_doc_bytes"] = self.min_doc_bytes
        return identity

    def content_digest(self) -> str:
        """The digest of the local data files' names and bytes (files_digest), with the load_dataset arguments
        (a hub dataset's content is not read here)."""
        files = self.patterns()
        local = [m for f in files for m in self.local_files(f)]
        return cache_key([self.name, self.text_field, self.split, files, files_digest("", local)])

    def split_bytes(self, split: str, eval_fraction: float) -> None:
        """Unknown before the rows are read (a progress line without a total)."""
        return None

    def rows(self):
        """The dataset of the split (an IterableDataset when streaming)."""
        import datasets  # imported only for this source: it is slow to import

        kwargs = {"sample_by": "document"} if self.name == "text" else {}
        return datasets.load_dataset(
            self.name, data_files=self.data_files, split=self.split, streaming=self.streaming, **kwargs
        )

    def documents(self, split: str, eval_fraction: float) -> Iterator[Iterator[str]]:
        """Each row's text in `split` (by the hash of its index) as a one-piece iterator (see `named_documents`)."""
        return (pieces for _, pieces in self.named_documents(split, eval_fraction))

    def named_documents(self, split: str, eval_fraction: float) -> Iterator[tuple[str, Iterator[str]]]:
        """(the row index as a string, its text as a one-piece iterator) of each row in `split` (by the hash of
        its index) whose text has at least min_doc_bytes bytes."""
        for index, row in enumerate(self.rows()):
            if self.text_field not in row:
                raise ValueError(f"data.hf_text_field={self.text_field!r} is not a column of {self.name}: {list(row)}")
            text = row[self.text_field]
            if in_eval(str(index), eval_fraction) == (split == "eval") and utf8_bytes(text) >= self.min_doc_bytes:
                yield str(index), iter([text])
