"""Tokenizers of the text task: bytes (ids 0..255 the UTF-8 bytes, EOD = 256, vocab 257) or a byte-level BPE
trained with Hugging Face `tokenizers`, with EOD a special token.

`token_bytes[id]` is the number of UTF-8 bytes token `id` stands for, for bits per byte: each character of a
byte-level BPE token is one byte; EOD counts as one byte (the document boundary, as a newline would be), so with
the bytes tokenizer bits per byte is exactly the loss in bits per token.
"""

import hashlib
import os
from collections.abc import Iterator

import numpy as np

EOD_TOKEN = "<|endofdocument|>"


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 and EOD = 256."""

    vocab_size, eod, identity = 257, 256, "bytes"

    def __init__(self):
        self.token_bytes = np.ones(self.vocab_size, np.int64)

    def encode(self, text: str) -> np.ndarray:
        """The byte ids [len(text.encode())] (uint16) of `text`."""
        return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids) -> str:
        """The text of a sequence of ids, each EOD written as a newline (invalid UTF-8 replaced)."""
        ids = np.asarray(ids)
        return np.where(ids == self.eod, ord("\n"), ids).astype(np.uint8).tobytes().decode(errors="replace")


class BPETokenizer:
    """A byte-level BPE (`tokenizers.Tokenizer`) whose special token EOD_TOKEN ends each document."""

    def __init__(self, tokenizer):
        tokenizer.encode_special_tokens = True  # EOD_TOKEN written in a document is text, not a boundary
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.eod = tokenizer.token_to_id(EOD_TOKEN)
        if self.eod is None:
            raise ValueError(f"the tokenizer has no {EOD_TOKEN!r} special token")
        vocab = tokenizer.get_vocab()
        self.token_bytes = np.zeros(self.vocab_size, np.int64)
        for token, i in vocab.items():
            self.token_bytes[i] = 1 if i == self.eod else len(token)  # one byte per byte-level character
        self.identity = "bpe-" + hashlib.blake2b(tokenizer.to_str().encode(), digest_size=16).hexdigest()

    @classmethod
    def train(cls, texts: Iterator[str], vocab_size: int) -> "BPETokenizer":
        """A byte-level BPE of (at most) vocab_size ids learnt from `texts`, one piece at a time."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOD_TOKEN],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer)
        return cls(tokenizer)

    @classmethod
    def load(cls, path: str) -> "BPETokenizer":
        """The tokenizer saved at `path` (tokenizer.json); ValueError naming the file when it cannot be read."""
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises its own Exception with serde's message ("EOF while parsing")
            raise ValueError(f"tokenizer.json at {path} cannot be read ({e}): it is damaged or cut short") from None
        return cls(tokenizer)

    def save(self, path: str) -> None:
        """Write tokenizer.json at `path` atomically (a temporary file, then a rename)."""
        tmp = f"{path}.tmp{os.getpid()}"
        self.tokenizer.save(tmp)
        os.replace(tmp, path)

    def encode(self, text: str) -> np.ndarray:
        """The ids [N] (uint32) of `text`."""
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.uint32)

    def decode(self, ids) -> str:
        """The text of a sequence of ids, each EOD written as a newline."""
        ids = [int(i) for i in ids]
        pieces, run = [], []
        for i in [*ids, self.eod]:
            if i == self.eod:
                pieces.append(self.tokenizer.decode(run))
                run = []
            else:
                run.append(i)
        return "\n".join(pieces)
