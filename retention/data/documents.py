"""The documents of a text split one by one, each named, hashed and tokenised, and the rule that picks the long ones
an evaluation reads whole (experiments/long_context).

A `Document` is a document of a source's split (retention/data/corpus.py: a file under the folder, or a Hugging
Face row) with its name, its bytes, the sha256 of its UTF-8 bytes (a file's sha256) and its ids as the token cache
holds them (retention/data/encode.py: the ids of its text pieces, then EOD). `select_documents` keeps those of at
least `min_ids` ids, in ascending order of the split's hash of their names (corpus.split_hash, the number the split
compares with eval_fraction), the first `limit`: a fixed, name-only order, so a longer list extends a shorter one.
A result records `selection_rule(...)` and each chosen document's `record()`, so it says exactly which text it read.
"""

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator

import numpy as np

from retention.data.cache import SPLIT_RULE
from retention.data.corpus import FolderSource, HFSource, split_hash
from retention.data.encode import corpus_ids
from retention.data.progress import Meter
from retention.validation import check_choice, check_int


@dataclasses.dataclass(frozen=True)
class Document:
    """One document: its name in the source, its UTF-8 bytes, their sha256, its ids [N] (its text's, then EOD)."""

    name: str
    n_bytes: int
    sha256: str
    ids: np.ndarray

    def record(self) -> dict:
        """What a result keeps of the document: name, bytes, sha256 and the number of ids (EOD included)."""
        return {"name": self.name, "bytes": self.n_bytes, "sha256": self.sha256, "ids": int(len(self.ids))}


def _hashed(pieces: Iterable[str], digest, sizes: list[int]) -> Iterator[str]:
    """The text pieces as they are, each one's UTF-8 bytes fed to `digest` and their count appended to `sizes`."""
    for text in pieces:
        raw = text.encode()
        digest.update(raw)
        sizes.append(len(raw))
        yield text


def read_documents(source: FolderSource | HFSource, split: str, eval_fraction: float, tokenizer) -> list[Document]:
    """Every document of a split, read and tokenised one by one (a progress line counts the text).

    Args:
        source: the corpus (its min_doc_bytes already applied).
        split: "train" or "eval".
        eval_fraction: the split's threshold on the name hash (as the Text task's).
        tokenizer: a ByteTokenizer or HFTokenizer (`encode_batch`, `eod`).

    Returns:
        The split's documents in the source's order (sorted names, or row order).
    """
    check_choice("split", split, ("train", "eval"))
    documents = []
    with Meter(f"reading the {split} split's documents one by one", source.split_bytes(split, eval_fraction)) as m:
        for name, pieces in source.named_documents(split, eval_fraction):
            digest, sizes = hashlib.sha256(), []
            ids = np.concatenate(list(corpus_ids(tokenizer, iter([_hashed(pieces, digest, sizes)]), m)))
            documents.append(Document(name, sum(sizes), digest.hexdigest(), ids))
    return documents


def select_documents(documents: Iterable[Document], min_ids: int, limit: int | None = None) -> list[Document]:
    """The documents an evaluation reads whole, by the module's rule.

    Args:
        documents: candidates (e.g. `read_documents` of the eval split).
        min_ids: the fewest ids a chosen document has (EOD included): an evaluation of L tokens from a document's
            start reads L + 1 (inputs and next-token targets).
        limit: at most this many (None: all).

    Returns:
        Those with at least min_ids ids, in ascending split hash of their names, the first `limit`.
    """
    check_int("min_ids", min_ids)
    if limit is not None:
        check_int("limit", limit)
    chosen = sorted((d for d in documents if len(d.ids) >= min_ids), key=lambda d: split_hash(d.name))
    return chosen[:limit]


def selection_rule(source: FolderSource | HFSource, eval_fraction: float, min_ids: int, limit: int | None) -> dict:
    """The rule `select_documents` applied to a source's eval split, as a result records it.

    Args:
        source: the corpus.
        eval_fraction: its split's threshold.
        min_ids: select_documents' min_ids.
        limit: select_documents' limit.

    Returns:
        {"source", "min_doc_bytes", "split", "eval_fraction", "min_ids", "order", "limit"}.
    """
    where = source.root if isinstance(source, FolderSource) else f"hf:{source.name} {source.data_files}"
    return {
        "source": where,
        "min_doc_bytes": source.min_doc_bytes,
        "split": f"eval: {SPLIT_RULE}",
        "eval_fraction": eval_fraction,
        "min_ids": min_ids,
        "order": "ascending blake2b(name)/2**64",
        "limit": limit,
    }
