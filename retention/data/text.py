"""Text as packed windows: a corpus (retention/data/corpus.py) tokenised once into a cached memmap per split
(retention/data/cache.py), EOD after each document, windows drawn at random offsets (retention/data/packing.py).

`tokenizer="bytes"`: ids 0..255 the UTF-8 bytes, EOD = 256, vocab 257. `tokenizer="bpe"`: a byte-level BPE of
`vocab_size` ids trained on the training split (retention/data/tokenizer.py); it is read from `tokenizer_path`
when that file exists (the trainer passes <run dir>/tokenizer.json, so a resumed run reuses its tokenizer), else
trained (once per corpus and vocab_size: kept in the cache folder) and saved there.
A batch holds windows of seq_len + 1 ids: inputs the first seq_len, targets the next ids, segment_ids.
"""

import itertools
import os

import numpy as np

from retention.data.base import Batch, rng_for
from retention.data.cache import SPLIT_RULE, cache_key, cached_ids, default_cache_dir, ids_dtype
from retention.data.corpus import FolderSource, HFSource, default_path
from retention.data.packing import pack_windows
from retention.data.tokenizer import BPETokenizer, ByteTokenizer
from retention.validation import check_choice, check_int, check_number

SOURCES, TOKENIZERS = ("folder", "hf"), ("bytes", "bpe")
DEFAULT_EXTENSIONS = [".py"]  # of the default corpus, the standard library
DEFAULT_BPE_VOCAB = 4096


def make_source(source, path, extensions, hf_name, hf_data_files, hf_text_field, hf_split, hf_streaming):
    """The FolderSource or HFSource the arguments name (ValueError naming a bad one)."""
    check_choice("source", source, SOURCES)
    if source == "folder":
        if hf_name is not None or hf_data_files is not None:
            raise ValueError(f"hf_name and hf_data_files are for source=hf, got {hf_name!r}, {hf_data_files!r}")
        if path is None and extensions is None:
            path, extensions = default_path(), DEFAULT_EXTENSIONS
        if extensions is not None and not (extensions and all(isinstance(e, str) and e for e in extensions)):
            raise ValueError(f"extensions must be a list of name endings such as ['.py', '.txt'], got {extensions!r}")
        return FolderSource(default_path() if path is None else path, extensions)
    if path is not None or extensions is not None:
        raise ValueError(f"path and extensions are for source=folder, got {path!r}, {extensions!r}")
    if not isinstance(hf_name, str) or not hf_name:
        raise ValueError(f"hf_name must name a Hugging Face dataset or builder (text, json, parquet), got {hf_name!r}")
    if not isinstance(hf_text_field, str) or not hf_text_field:
        raise ValueError(f"hf_text_field must name the column holding the text, got {hf_text_field!r}")
    if not isinstance(hf_split, str) or not hf_split:
        raise ValueError(f"hf_split must name a split of the dataset (e.g. train), got {hf_split!r}")
    check_choice("hf_streaming", hf_streaming, (True, False))
    return HFSource(hf_name, hf_data_files, hf_text_field, hf_split, hf_streaming)


class Text:
    """Packed text windows [batch_size, seq_len] from a folder (default: the stdlib's .py files) or a Hugging
    Face dataset; `token_bytes[id]` is the UTF-8 bytes of each id (for bits per byte)."""

    def __init__(
        self,
        *,
        seq_len: int,
        batch_size: int,
        source: str = "folder",
        path: str | None = None,
        extensions: list[str] | None = None,
        eval_fraction: float = 0.05,
        tokenizer: str = "bytes",
        vocab_size: int | None = None,
        hf_name: str | None = None,
        hf_data_files: list[str] | None = None,
        hf_text_field: str = "text",
        hf_split: str = "train",
        hf_streaming: bool = False,
        cache_dir: str | None = None,
        tokenizer_path: str | None = None,
        seed: int = 0,
    ):
        check_int("seq_len", seq_len)
        check_int("batch_size", batch_size)
        check_number("eval_fraction", eval_fraction, low=0, high=1, open_low=True, open_high=True)
        check_choice("tokenizer", tokenizer, TOKENIZERS)
        if tokenizer == "bytes" and vocab_size not in (None, ByteTokenizer.vocab_size):
            raise ValueError(f"vocab_size must be null or 257 with tokenizer=bytes, got {vocab_size!r}")
        if tokenizer == "bpe" and vocab_size is not None:
            check_int("vocab_size", vocab_size, low=ByteTokenizer.vocab_size)
        self.source = make_source(
            source, path, extensions, hf_name, hf_data_files, hf_text_field, hf_split, hf_streaming
        )
        self.seq_len, self.batch_size, self.seed, self.eval_fraction = seq_len, batch_size, seed, eval_fraction
        self.cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        corpus = [self.source.identity(), SPLIT_RULE, eval_fraction]
        if tokenizer == "bytes":
            self.tokenizer = ByteTokenizer()
        else:
            self.tokenizer = self._bpe(corpus, vocab_size or DEFAULT_BPE_VOCAB, tokenizer_path)
        self.vocab_size, self.eod, self.token_bytes = (
            self.tokenizer.vocab_size,
            self.tokenizer.eod,
            self.tokenizer.token_bytes,
        )
        key = cache_key(corpus, self.tokenizer.identity)
        dtype = ids_dtype(self.vocab_size)
        self.splits = {
            split: cached_ids(
                os.path.join(self.cache_dir, f"{key}.{split}.{dtype.name}"), self._ids(split), dtype, self.vocab_size
            )
            for split in ("train", "eval")
        }
        self.check_length("seq_len", seq_len)

    def fingerprints(self) -> dict[str, str]:
        """What a run's record keeps of its data beyond the config: the tokenizer's identity (a hash of its
        tokenizer.json content) and a digest of the corpus files' bytes (reading the corpus once)."""
        return {"tokenizer": self.tokenizer.identity, "corpus": self.source.content_digest()}

    def _bpe(self, corpus: list, vocab_size: int, tokenizer_path: str | None) -> BPETokenizer:
        """The run's BPE: read from tokenizer_path when it exists, else the cached one, else trained on the
        training split; copied to tokenizer_path when given."""
        if tokenizer_path is not None and os.path.isfile(tokenizer_path):
            return BPETokenizer.load(tokenizer_path)
        cached = os.path.join(self.cache_dir, f"{cache_key(corpus, 'bpe', vocab_size)}.tokenizer.json")
        if os.path.isfile(cached):
            bpe = BPETokenizer.load(cached)
        else:
            texts = itertools.chain.from_iterable(self.source.documents("train", self.eval_fraction))
            bpe = BPETokenizer.train(texts, vocab_size)
            os.makedirs(self.cache_dir, exist_ok=True)
            bpe.save(cached)
        if tokenizer_path is not None:
            os.makedirs(os.path.dirname(os.path.abspath(tokenizer_path)), exist_ok=True)
            bpe.save(tokenizer_path)
        return bpe

    def _ids(self, split: str):
        """The ids of `split`, piece by piece: each document's text pieces encoded, then EOD."""
        eod = np.array([self.tokenizer.eod])
        for pieces in self.source.documents(split, self.eval_fraction):
            for text in pieces:
                yield self.tokenizer.encode(text)
            yield eod

    def check_length(self, name: str, seq_len: int) -> None:
        """Each split must hold a window of seq_len + 1 ids."""
        check_int(name, seq_len)
        sizes = {split: len(ids) for split, ids in self.splits.items()}
        if min(sizes.values()) < seq_len + 1:
            raise ValueError(
                f"{name} must be < the ids in each split of the corpus ({sizes}; a split holds the documents whose "
                f"name hashes below/above eval_fraction={self.eval_fraction}), got {seq_len}"
            )

    def batch(self, index: int, *, seq_len: int | None = None, split: str = "train") -> Batch:
        """Batch `index` of `split`: windows at random offsets packed into inputs, targets (IGNORE after an EOD)
        and segment_ids, each [batch_size, seq_len]."""
        L = self.seq_len if seq_len is None else seq_len
        self.check_length("seq_len", L)
        rng = rng_for(self.seed, split, index, L)
        ids = self.splits[split]
        starts_B = rng.integers(0, len(ids) - L, size=self.batch_size)
        return pack_windows(np.stack([ids[s : s + L + 1] for s in starts_B]), self.eod)  # no [B, T] index array
