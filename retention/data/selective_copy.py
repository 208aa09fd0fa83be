"""Selective copying (Gu and Dao, 2023): copy the M content tokens scattered among noise, in order.

Ids: 0 is noise, 1 is the marker, 2 .. 2 + n_tokens - 1 are content. A row holds seq_len - M context positions,
noise except at M random positions carrying content tokens, then M markers; the target at the i-th marker is
the i-th content token (in order of position), IGNORE elsewhere.
"""

import numpy as np

from retention.data.base import IGNORE, Batch, rng_for
from retention.validation import check_int

NOISE, MARKER, FIRST_TOKEN = 0, 1, 2


class SelectiveCopy:
    """Selective-copying batches [batch_size, seq_len] with num_copy tokens to copy."""

    def __init__(self, *, seq_len: int, batch_size: int, num_copy: int = 8, n_tokens: int = 16, seed: int = 0):
        for name, value in (
            ("seq_len", seq_len),
            ("batch_size", batch_size),
            ("num_copy", num_copy),
            ("n_tokens", n_tokens),
        ):
            check_int(name, value)
        self.seq_len, self.batch_size, self.num_copy, self.seed = seq_len, batch_size, num_copy, seed
        self.vocab_size = FIRST_TOKEN + n_tokens
        self.check_length("seq_len", seq_len)

    def check_length(self, name: str, seq_len: int) -> None:
        """The context must hold the num_copy tokens: seq_len >= 2 * num_copy."""
        check_int(name, seq_len)
        if seq_len < 2 * self.num_copy:
            raise ValueError(f"{name} must be >= 2 * num_copy = {2 * self.num_copy}, got {seq_len}")

    def batch(self, index: int, *, seq_len: int | None = None, split: str = "train") -> Batch:
        """Batch `index` of `split`: inputs and targets [batch_size, seq_len] (targets at the markers)."""
        L = self.seq_len if seq_len is None else seq_len
        self.check_length("seq_len", L)
        rng = rng_for(self.seed, split, index, L)
        B, M = self.batch_size, self.num_copy
        context = L - M
        tokens_BM = rng.integers(FIRST_TOKEN, self.vocab_size, size=(B, M))
        pos_BM = np.sort(np.stack([rng.choice(context, M, replace=False) for _ in range(B)]), axis=1)
        inputs_BL = np.full((B, L), NOISE)
        np.put_along_axis(inputs_BL, pos_BM, tokens_BM, axis=1)
        inputs_BL[:, context:] = MARKER
        targets_BL = np.full((B, L), IGNORE)
        targets_BL[:, context:] = tokens_BM
        return Batch(inputs_BL.astype(np.int32), targets_BL.astype(np.int32))
