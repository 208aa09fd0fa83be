"""Context utilisation: the held-out loss of trained text models against position, on whole long documents.

Each chosen document (retention/data/documents.py: the run's own eval split, at least L + 1 ids, in ascending hash
of their names, the first `docs`) is cut to its first L + 1 ids and read as ONE sequence from its start: inputs
ids[:L], targets ids[1:L + 1] (a chosen document's EOD is at index L or later, so no input is an EOD and every
position has a target). The per-position nll is summed over the documents and reported per position bucket
(`retention.train.evaluate.position_buckets`: [0, 1), [1, 2), [2, 4), ..., [L/2, L)) as the mean loss in nats per
token and in bits per byte (the bytes the targets stand for, `bits_per_byte`), with the bucket's token count. A
position p predicts token p + 1 from p + 1 tokens of context, as the trainer's `loss_pos_{lo}_{hi}`.
"""

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from experiments.long_context.models import Trained
from retention.data.documents import Document, read_documents, select_documents, selection_rule
from retention.data.text import make_source
from retention.train.evaluate import bits_per_byte, position_buckets


def eval_documents(trained: Trained, length: int, docs: int | None) -> tuple[dict, list[Document]]:
    """The documents a text run is read on at `length`, and the rule that chose them.

    Args:
        trained: a text run (its data config names its corpus and split; its tokenizer makes the ids).
        length: L, the tokens read from each document's start.
        docs: at most this many documents (None: every one the rule keeps).

    Returns:
        (selection_rule's record, the chosen documents).

    Raises:
        ValueError: fewer documents than `docs` (or none) have L + 1 ids under the run's tokenizer.
    """
    data = trained.config.data
    fields = ("source", "path", "extensions", "hf_name", "hf_data_files", "hf_text_field", "hf_split", "hf_streaming")
    source = make_source(*(getattr(data, f) for f in fields), data.min_doc_bytes)
    documents = read_documents(source, "eval", data.eval_fraction, trained.text_tokenizer())
    chosen = select_documents(documents, length + 1, docs)
    if len(chosen) < (docs or 1):
        raise ValueError(
            f"--docs must be <= the eval documents of {trained.folder} with at least L + 1 = {length + 1} ids "
            f"({len(chosen)}: data.min_doc_bytes={data.min_doc_bytes}, data.eval_fraction={data.eval_fraction}; "
            f"train on data=long_text), got {docs}"
        )
    return selection_rule(source, data.eval_fraction, length + 1, docs), chosen


def bucket_table(nll_T: np.ndarray, labels_T: np.ndarray, bytes_T: np.ndarray) -> list[dict]:
    """Per position bucket: its bounds, tokens, bytes, summed and mean nll (nats per token) and bits per byte.

    Args:
        nll_T: summed nll at each position [L] (nats, over the documents).
        labels_T: targets at each position [L].
        bytes_T: the UTF-8 bytes those targets stand for [L].

    Returns:
        [{"lo", "hi", "tokens", "bytes", "nll", "loss", "bits_per_byte"}] for position_buckets(L), NaN where a
        bucket has no target.
    """
    rows = []
    for lo, hi in position_buckets(len(nll_T)):
        tokens, n_bytes, nll = float(labels_T[lo:hi].sum()), int(bytes_T[lo:hi].sum()), float(nll_T[lo:hi].sum())
        loss = nll / tokens if tokens else float("nan")
        row = {"lo": lo, "hi": hi, "tokens": int(tokens), "bytes": n_bytes, "nll": nll, "loss": loss}
        rows.append({**row, "bits_per_byte": bits_per_byte(nll, n_bytes)})
    return rows


def position_losses(sums: Callable, length: int, documents: list[Document], token_bytes: np.ndarray) -> dict:
    """The loss by position of one model over the documents, each read as one sequence of `length` tokens.

    Args:
        sums: the model's masked sums of [1, length] inputs and targets (experiments/long_context/reader.py's
            `Reader.sums`): a dict with nll_T and labels_T [length].
        length: L, the tokens read from each document's start.
        documents: the chosen documents (each with at least L + 1 ids).
        token_bytes: the UTF-8 bytes of each id (the tokenizer's token_bytes).

    Returns:
        {"documents", "tokens", "loss", "bits_per_byte", "buckets" (bucket_table), "seconds" (all documents, the
        first one's compilation on the carry path included), "document_seconds"}.
    """
    L = length
    if short := [d.name for d in documents if len(d.ids) < L + 1]:
        raise ValueError(f"documents must have at least L + 1 = {L + 1} ids, got {short[:3]} with fewer")
    nll_T, labels_T, bytes_T = np.zeros(L), np.zeros(L), np.zeros(L, np.int64)
    seconds = []
    for doc in documents:
        window = np.asarray(doc.ids[: L + 1], np.int32)
        start = time.perf_counter()
        out = jax.device_get(sums(jnp.asarray(window[None, :-1]), jnp.asarray(window[None, 1:])))
        seconds.append(time.perf_counter() - start)
        nll_T += out["nll_T"]
        labels_T += out["labels_T"]
        bytes_T += token_bytes[window[1:]]
    buckets = bucket_table(nll_T, labels_T, bytes_T)
    nll, tokens = float(nll_T.sum()), int(labels_T.sum())
    return {
        "documents": len(documents),
        "tokens": tokens,
        "loss": nll / tokens,
        "bits_per_byte": bits_per_byte(nll, int(bytes_T.sum())),
        "buckets": buckets,
        "seconds": sum(seconds),
        "document_seconds": seconds,
    }
