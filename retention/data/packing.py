"""Packing documents into fixed windows: a window of T + 1 ids from a stream where EOD ends each document.

inputs = window[:-1] and targets = window[1:]. segment_ids[b, t] is the number of EOD tokens in inputs[b, :t]
(an EOD belongs to the document it ends), so positions with equal ids are one document. The target at t is
IGNORE where inputs[b, t] is EOD: it would predict the first token of the next document from the previous one;
the target EOD at a document's last token (predicting its end) is kept.
"""

import numpy as np

from retention.data.base import IGNORE, Batch


def segment_ids_from_eod(inputs_BT: np.ndarray, eod: int) -> np.ndarray:
    """segment_ids [B, T] int32: the count of EOD tokens in inputs[b, :t] at each (b, t)."""
    is_eod_BT = inputs_BT == eod
    return np.cumsum(is_eod_BT, axis=-1, dtype=np.int32) - is_eod_BT


def mask_cross_document_targets(inputs_BT: np.ndarray, targets_BT: np.ndarray, eod: int) -> np.ndarray:
    """targets [B, T] int32 with IGNORE where inputs is EOD (the next document's first token)."""
    return np.where(inputs_BT == eod, IGNORE, np.asarray(targets_BT, dtype=np.int32)).astype(np.int32)


def pack_windows(windows_BL1: np.ndarray, eod: int) -> Batch:
    """The Batch of windows [B, T + 1] of ids: inputs, targets masked across documents, segment_ids."""
    windows_BL1 = np.asarray(windows_BL1, dtype=np.int32)
    inputs_BT = windows_BL1[:, :-1]
    targets_BT = mask_cross_document_targets(inputs_BT, windows_BL1[:, 1:], eod)
    return Batch(inputs_BT, targets_BT, segment_ids_from_eod(inputs_BT, eod))
