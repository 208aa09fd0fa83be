"""Tokenizers of the text task: bytes (ids 0..255 the UTF-8 bytes, EOD = 256, vocab 257) or any Hugging Face
`tokenizers` tokenizer.json (a byte-level BPE trained here, or a foreign one), with a token of its vocab as EOD.

A tokenizer.json is used as a document encoder: no truncation, no padding, no special tokens added around a text
(a BOS/EOS post-processor is skipped), and special tokens written in a document are text, never boundaries.

`token_bytes[id]` is the number of UTF-8 bytes token `id` stands for, for bits per byte. A byte-level tokenizer
(its decoder ByteLevel, as GPT-2's, Llama 3's and the BPE trained here): one byte per character of the token, exact.
Any other (Metaspace/SentencePiece-style, WordPiece, ...): the bytes the token adds when decoded after itself (so a
word-start marker such as `▁` counts its space, as the text it encodes has one); a byte-fallback token `<0xHH>` is
one byte. An added token: its text's bytes. EOD counts as one byte (the document boundary, as a newline would be),
so with the bytes tokenizer bits per byte is exactly the loss in bits per token.
"""

import hashlib
import json
import os
import re
from collections.abc import Iterator

import numpy as np

EOD_TOKEN = "<|endofdocument|>"
BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a SentencePiece byte-fallback token: one raw byte


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 and EOD = 256."""

    vocab_size, eod, identity = 257, 256, "bytes"

    def __init__(self):
        self.token_bytes = np.ones(self.vocab_size, np.int64)

    def encode(self, text: str) -> np.ndarray:
        """The byte ids [len(text.encode())] (uint16) of `text`."""
        return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.uint16)

    def encode_batch(self, texts: list[str]) -> Iterator[np.ndarray]:
        """encode of each text, one at a time (numpy: nothing to gain from a batch)."""
        return map(self.encode, texts)

    def decode(self, ids) -> str:
        """The text of a sequence of ids, each EOD written as a newline (invalid UTF-8 replaced)."""
        ids = np.asarray(ids)
        return np.where(ids == self.eod, ord("\n"), ids).astype(np.uint8).tobytes().decode(errors="replace")


def _byte_level(decoder: dict | None) -> bool:
    """Whether a tokenizer.json decoder is (or holds, in a Sequence) the ByteLevel decoder."""
    if decoder is None:
        return False
    return decoder["type"] == "ByteLevel" or any(_byte_level(d) for d in decoder.get("decoders", []))


def token_bytes_of(tokenizer, spec: dict, eod: int, vocab_size: int) -> np.ndarray:
    """[vocab_size] int64: the UTF-8 bytes each id of `tokenizer` (its tokenizer.json parsed as `spec`) stands
    for, as the module docstring says; ids the vocab skips stand for 0."""
    out = np.zeros(vocab_size, np.int64)
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    if _byte_level(spec.get("decoder")):
        for token, i in vocab.items():
            out[i] = len(token)  # each character one byte of the ByteLevel alphabet
    else:
        tokens, ids = list(vocab), list(vocab.values())
        alone = tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
        twice = tokenizer.decode_batch([[i, i] for i in ids], skip_special_tokens=False)
        fallback = bool(spec["model"].get("byte_fallback"))
        for token, i, one, two in zip(tokens, ids, alone, twice):
            out[i] = 1 if fallback and BYTE_FALLBACK.fullmatch(token) else len(two.encode()) - len(one.encode())
    for i, added in tokenizer.get_added_tokens_decoder().items():
        out[i] = len(added.content.encode())
    out[eod] = 1
    return out


class HFTokenizer:
    """A `tokenizers.Tokenizer` (any tokenizer.json) whose token `eod_token` ends each document; `origin` names
    where it came from in errors. ValueError naming eod_token, with the tokenizer's added tokens, when its vocab
    lacks it."""

    def __init__(self, tokenizer, eod_token: str = EOD_TOKEN, origin: str = "the tokenizer"):
        tokenizer.encode_special_tokens = True  # a special token written in a document is text, not a boundary
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.eod = tokenizer.token_to_id(eod_token)
        if self.eod is None:
            added = sorted(t.content for t in tokenizer.get_added_tokens_decoder().values())
            raise ValueError(
                f"eod_token must be a token of {origin}, got {eod_token!r} (not in its vocab of "
                f"{tokenizer.get_vocab_size()}; its added tokens: {added})"
            )
        self.vocab_size = max(tokenizer.get_vocab().values()) + 1
        content = tokenizer.to_str()
        spec = json.loads(content)
        self.token_bytes = token_bytes_of(tokenizer, spec, self.eod, self.vocab_size)
        digest = hashlib.blake2b(content.encode(), digest_size=16).hexdigest()
        eod = "" if eod_token == EOD_TOKEN else f"-eod{self.eod}"  # the project's separator: the name alone
        self.identity = f"{spec['model']['type'].lower()}-{digest}{eod}"

    @classmethod
    def train(cls, texts: Iterator[str], vocab_size: int, eod_token: str = EOD_TOKEN) -> "HFTokenizer":
        """A byte-level BPE of (at most) vocab_size ids, eod_token its special token, learnt from `texts` one
        piece at a time."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[eod_token],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,  # the caller's Meter shows the text read
        )
        tokenizer.train_from_iterator(texts, trainer)
        return cls(tokenizer, eod_token)

    @classmethod
    def load(cls, path: str, eod_token: str = EOD_TOKEN) -> "HFTokenizer":
        """The tokenizer saved at `path` (tokenizer.json); ValueError naming the file when it cannot be read."""
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises its own Exception with serde's message ("EOF while parsing")
            raise ValueError(f"tokenizer.json at {path} cannot be read ({e}): it is damaged or cut short") from None
        return cls(tokenizer, eod_token, f"the tokenizer at {path}")

    def save(self, path: str) -> None:
        """Write tokenizer.json at `path` atomically (a temporary file, then a rename)."""
        tmp = f"{path}.tmp{os.getpid()}"
        self.tokenizer.save(tmp)
        os.replace(tmp, path)

    def encode(self, text: str) -> np.ndarray:
        """The ids [N] (uint32) of `text`."""
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.uint32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """encode of each text, the batch encoded by parallel threads in Rust (`encode_batch_fast`: no offsets)."""
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encodings]

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
