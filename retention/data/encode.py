"""The ids of a corpus split, for the token cache: the documents' text pieces gathered into batches of about
BATCH_BYTES of text (less than that and one piece), each batch encoded by one `encode_batch` call (Hugging Face
`tokenizers` encodes the pieces of a batch on parallel threads), EOD after each document's last piece. Only one
batch of text and its ids is held at once, never the corpus, and the ids are those of one `encode` per piece (the
pieces are the same: a file's pieces are about corpus.CHUNK_BYTES long, so a batch holds many small documents).
"""

from collections.abc import Iterator

import numpy as np

from retention.data.progress import Meter, utf8_bytes

BATCH_BYTES = 1 << 22  # 4 MiB of text per encode_batch call


def _encoded(tokenizer, batch: list[str | None], eod_1: np.ndarray) -> Iterator[np.ndarray]:
    """The ids of `batch` in order: each text's, and EOD at each None (a document's end)."""
    ids = iter(tokenizer.encode_batch([text for text in batch if text is not None]))
    for text in batch:
        yield eod_1 if text is None else next(ids)


def corpus_ids(tokenizer, documents: Iterator[Iterator[str]], meter: Meter) -> Iterator[np.ndarray]:
    """The ids of `documents` (each an iterator of its text pieces) piece by piece: every piece's ids, then EOD
    [1] after each document; `meter` counts the bytes of text encoded."""
    eod_1 = np.array([tokenizer.eod])
    batch, size = [], 0
    for pieces in documents:
        for text in pieces:
            batch.append(text)
            size += utf8_bytes(text)
            if size >= BATCH_BYTES:  # encoded at once: the piece just read is not held while the next is read
                yield from _encoded(tokenizer, batch, eod_1)
                meter.update(size)
                batch, size = [], 0
        batch.append(None)
    yield from _encoded(tokenizer, batch, eod_1)
    meter.update(size)
