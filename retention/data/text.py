"""Text as packed windows: a corpus (retention/data/corpus.py) tokenised once, in batches (retention/data/encode.py),
into a cached memmap per split (retention/data/cache.py), EOD after each document; the training windows at random
offsets or walking epochs (retention/data/sampler.py), the eval windows at random offsets; packed with segment ids
(retention/data/packing.py). `min_doc_bytes`: only the documents of at least that many bytes, in both splits
(retention/data/corpus.py; the `long_text` data config: whole long documents, the eval split's also read one by one,
named and hashed, by retention/data/documents.py).

`tokenizer="bytes"`: ids 0..255 the UTF-8 bytes, EOD = 256, vocab 257. `tokenizer="bpe"`: a byte-level BPE of
`vocab_size` ids trained on the training split (retention/data/tokenizer.py), `eod_token` its special token.
`tokenizer="file"`: the tokenizer.json at `tokenizer_file` (any Hugging Face tokenizer), `eod_token` a token of its
vocab (e.g. `</s>`, `<|endoftext|>`). Either is read from `tokenizer_path` when that file exists (the trainer passes
<run dir>/tokenizer.json, so a resumed run reuses its tokenizer), else trained (once per corpus, vocab_size and
eod_token: kept in the cache folder) or read, and saved there. A progress line shows a BPE training or a split
being tokenised (retention/data/progress.py).
A batch holds windows of seq_len + 1 ids: inputs the first seq_len, targets the next ids, segment_ids.
"""

import itertools
import os

import numpy as np

from retention.data.base import Batch
from retention.data.cache import SPLIT_RULE, cache_key, cached_ids, default_cache_dir, ids_dtype
from retention.data.corpus import FolderSource, HFSource, default_path
from retention.data.encode import corpus_ids
from retention.data.packing import pack_windows
from retention.data.progress import Meter
from retention.data.sampler import SAMPLERS, window_starts
from retention.data.tokenizer import EOD_TOKEN, ByteTokenizer, HFTokenizer
from retention.validation import check_choice, check_int, check_number

SOURCES, TOKENIZERS = ("folder", "hf"), ("bytes", "bpe", "file")
DEFAULT_EXTENSIONS = [".py"]  # of the default corpus, the standard library
DEFAULT_BPE_VOCAB = 4096


def make_source(
    source, path, extensions, hf_name, hf_data_files, hf_text_field, hf_split, hf_streaming, min_doc_bytes=0
):
    """The FolderSource or HFSource the arguments name, holding the documents of at least min_doc_bytes bytes
    (ValueError naming a bad argument)."""
    check_choice("source", source, SOURCES)
    check_int("min_doc_bytes", min_doc_bytes, low=0)
    if source == "folder":
        if hf_name is not None or hf_data_files is not None:
            raise ValueError(f"hf_name and hf_data_files are for source=hf, got {hf_name!r}, {hf_data_files!r}")
        if path is None and extensions is None:
            path, extensions = default_path(), DEFAULT_EXTENSIONS
        if extensions is not None and not (extensions and all(isinstance(e, str) and e for e in extensions)):
            raise ValueError(f"extensions must be a list of name endings such as ['.py', '.txt'], got {extensions!r}")
        return FolderSource(default_path() if path is None else path, extensions, min_doc_bytes)
    if path is not None or extensions is not None:
        raise ValueError(f"path and extensions are for source=folder, got {path!r}, {extensions!r}")
    if not isinstance(hf_name, str) or not hf_name:
        raise ValueError(f"hf_name must name a Hugging Face dataset or builder (text, json, parquet), got {hf_name!r}")
    if not isinstance(hf_text_field, str) or not hf_text_field:
        raise ValueError(f"hf_text_field must name the column holding the text, got {hf_text_field!r}")
    if not isinstance(hf_split, str) or not hf_split:
        raise ValueError(f"hf_split must name a split of the dataset (e.g. train), got {hf_split!r}")
    check_choice("hf_streaming", hf_streaming, (True, False))
    return HFSource(hf_name, hf_data_files, hf_text_field, hf_split, hf_streaming, min_doc_bytes)


def check_tokenizer(tokenizer: str, vocab_size, tokenizer_file, eod_token) -> None:
    """ValueError naming the first of the tokenizer arguments that does not fit `tokenizer`."""
    check_choice("tokenizer", tokenizer, TOKENIZERS)
    if not isinstance(eod_token, str) or not eod_token:
        raise ValueError(f"eod_token must be a token of the tokenizer's vocab (e.g. {EOD_TOKEN}), got {eod_token!r}")
    if tokenizer != "file" and tokenizer_file is not None:
        raise ValueError(f"tokenizer_file is for tokenizer=file, got {tokenizer_file!r} with tokenizer={tokenizer}")
    if tokenizer == "bytes":
        if vocab_size not in (None, ByteTokenizer.vocab_size):
            raise ValueError(f"vocab_size must be null or 257 with tokenizer=bytes, got {vocab_size!r}")
        if eod_token != EOD_TOKEN:
            raise ValueError(f"eod_token must be {EOD_TOKEN} with tokenizer=bytes (EOD is id 256), got {eod_token!r}")
    elif tokenizer == "bpe" and vocab_size is not None:
        check_int("vocab_size", vocab_size, low=ByteTokenizer.vocab_size)
    elif tokenizer == "file":
        if vocab_size is not None:
            raise ValueError(f"vocab_size must be null with tokenizer=file (the file's vocab), got {vocab_size!r}")
        if not isinstance(tokenizer_file, str) or not os.path.isfile(tokenizer_file):
            raise ValueError(f"tokenizer_file must be the path of a tokenizer.json file, got {tokenizer_file!r}")


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
        tokenizer_file: str | None = None,
        eod_token: str = EOD_TOKEN,
        sampler: str = "random",
        tokenizer_path: str | None = None,
        min_doc_bytes: int = 0,
        seed: int = 0,
    ):
        check_int("seq_len", seq_len)
        check_int("batch_size", batch_size)
        check_number("eval_fraction", eval_fraction, low=0, high=1, open_low=True, open_high=True)
        check_choice("sampler", sampler, SAMPLERS)
        check_tokenizer(tokenizer, vocab_size, tokenizer_file, eod_token)
        self.source = make_source(
            source, path, extensions, hf_name, hf_data_files, hf_text_field, hf_split, hf_streaming, min_doc_bytes
        )
        self.seq_len, self.batch_size, self.seed, self.eval_fraction = seq_len, batch_size, seed, eval_fraction
        self.sampler = sampler
        self.cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        corpus = [self.source.identity(), SPLIT_RULE, eval_fraction]
        self.tokenizer = self._tokenizer(tokenizer, corpus, vocab_size, tokenizer_file, eod_token, tokenizer_path)
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

    def _tokenizer(self, kind, corpus, vocab_size, tokenizer_file, eod_token, tokenizer_path):
        """The run's tokenizer: bytes; else the one at tokenizer_path when it exists (a resumed run's), else the
        file's (tokenizer=file) or the BPE (trained or cached), then copied to tokenizer_path when given."""
        if kind == "bytes":
            return ByteTokenizer()
        if tokenizer_path is not None and os.path.isfile(tokenizer_path):
            return HFTokenizer.load(tokenizer_path, eod_token)
        if kind == "file":
            chosen = HFTokenizer.load(tokenizer_file, eod_token)
        else:
            chosen = self._bpe(corpus, vocab_size or DEFAULT_BPE_VOCAB, eod_token)
        if tokenizer_path is not None:
            os.makedirs(os.path.dirname(os.path.abspath(tokenizer_path)), exist_ok=True)
            chosen.save(tokenizer_path)
        return chosen

    def _bpe(self, corpus: list, vocab_size: int, eod_token: str) -> HFTokenizer:
        """The BPE of this corpus, vocab_size and eod_token: the cached one, else trained on the training split
        (a progress line counting the text read) and cached."""
        named = ("bpe", vocab_size) if eod_token == EOD_TOKEN else ("bpe", vocab_size, eod_token)
        cached = os.path.join(self.cache_dir, f"{cache_key(corpus, *named)}.tokenizer.json")
        if os.path.isfile(cached):
            return HFTokenizer.load(cached, eod_token)
        total = self.source.split_bytes("train", self.eval_fraction)
        with Meter(f"training a BPE of {vocab_size} ids on the train split", total) as meter:
            texts = meter.texts(itertools.chain.from_iterable(self.source.documents("train", self.eval_fraction)))
            bpe = HFTokenizer.train(texts, vocab_size, eod_token)
        os.makedirs(self.cache_dir, exist_ok=True)
        bpe.save(cached)
        return bpe

    def _ids(self, split: str):
        """The ids of `split`, piece by piece (retention/data/encode.py), a progress line counting the text."""
        with Meter(f"tokenizing the {split} split", self.source.split_bytes(split, self.eval_fraction)) as meter:
            yield from corpus_ids(self.tokenizer, self.source.documents(split, self.eval_fraction), meter)

    def check_length(self, name: str, seq_len: int) -> None:
        """Each split must hold a window of seq_len + 1 ids."""
        check_int(name, seq_len)
        sizes = {split: len(ids) for split, ids in self.splits.items()}
        if min(sizes.values()) < seq_len + 1:
            raise ValueError(
                f"{name} must be < the ids in each split of the corpus ({sizes}; a split holds the documents of at "
                f"least min_doc_bytes={self.source.min_doc_bytes} bytes whose name hashes below/above "
                f"eval_fraction={self.eval_fraction}), got {seq_len}"
            )

    def batch(self, index: int, *, seq_len: int | None = None, split: str = "train") -> Batch:
        """Batch `index` of `split`: windows (training: by the sampler; eval: at random offsets) packed into
        inputs, targets (IGNORE after an EOD) and segment_ids, each [batch_size, seq_len]."""
        check_choice("split", split, tuple(self.splits))
        L = self.seq_len if seq_len is None else seq_len
        self.check_length("seq_len", L)
        ids = self.splits[split]
        sampler = self.sampler if split == "train" else "random"
        starts_B = window_starts(sampler, len(ids), L, self.batch_size, self.seed, split, index)
        return pack_windows(np.stack([ids[s : s + L + 1] for s in starts_B]), self.eod)  # no [B, T] index array
