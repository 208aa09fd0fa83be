"""Passkey retrieval: find five digits hidden in a long periodic filler.

Ids: digits 0-9 are 0..9, MARK is 10, QUERY is 11, filler ids are 12 .. 12 + n_filler - 1. A row is the filler
(the ids 12, 13, ... repeated), with the needle `MARK d1 d2 d3 d4 d5 MARK` at a depth in [0, 1] of it (0: the
start, 1: just before the query), and ends `QUERY d1 d2 d3 d4`: the targets at those five positions are
d1 .. d5 (predict the next digit), IGNORE elsewhere. Per-digit accuracy is the accuracy on the labelled
positions; exact match asks for all five.
"""

import numpy as np

from retention.data.base import IGNORE, Batch, rng_for
from retention.validation import check_int, check_number

DIGITS = 5
MARK, QUERY, FIRST_FILLER = 10, 11, 12
NEEDLE = DIGITS + 2  # MARK d1..d5 MARK


class Passkey:
    """Passkey batches [batch_size, seq_len]; training rows draw a uniform depth, `depth=` fixes it. `depths` are
    the depths evaluated one by one (the trainer's eval sets)."""

    def __init__(
        self,
        *,
        seq_len: int,
        batch_size: int,
        n_filler: int = 8,
        depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0),
        seed: int = 0,
    ):
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("n_filler", n_filler)):
            check_int(name, value)
        for depth in depths:
            check_number("depths[i]", depth, low=0, high=1)
        self.seq_len, self.batch_size, self.n_filler, self.seed = seq_len, batch_size, n_filler, seed
        self.depths = tuple(depths)
        self.vocab_size = FIRST_FILLER + n_filler
        self.check_length("seq_len", seq_len)

    def check_length(self, name: str, seq_len: int) -> None:
        """Room for the needle, the query and the digits: seq_len >= 2 * (DIGITS + 2) = 14."""
        check_int(name, seq_len)
        if seq_len < NEEDLE + DIGITS + 2:
            raise ValueError(f"{name} must be >= {NEEDLE + DIGITS + 2} (needle, query and digits), got {seq_len}")

    def batch(
        self, index: int, *, seq_len: int | None = None, split: str = "train", depth: float | None = None
    ) -> Batch:
        """Batch `index` of `split`: inputs and targets [batch_size, seq_len]; the needle at `depth` (a fraction
        of the filler) or, when None, at a uniform random depth per row."""
        L = self.seq_len if seq_len is None else seq_len
        self.check_length("seq_len", L)
        if depth is not None:
            check_number("depth", depth, low=0, high=1)
        rng = rng_for(self.seed, split, index, L)
        B = self.batch_size
        haystack = L - NEEDLE - DIGITS  # filler positions, plus the needle, plus QUERY d1..d4
        digits_BN = rng.integers(0, 10, size=(B, DIGITS))
        depth_B = rng.uniform(0, 1, size=B) if depth is None else np.full(B, depth)
        start_B = np.round(depth_B * haystack).astype(np.int64)

        inputs_BL = np.tile(FIRST_FILLER + np.arange(L) % self.n_filler, (B, 1))
        needle_BN = np.concatenate([np.full((B, 1), MARK), digits_BN, np.full((B, 1), MARK)], axis=1)
        np.put_along_axis(inputs_BL, start_B[:, None] + np.arange(NEEDLE), needle_BN, axis=1)
        inputs_BL[:, L - DIGITS] = QUERY
        inputs_BL[:, L - DIGITS + 1 :] = digits_BN[:, :-1]
        targets_BL = np.full((B, L), IGNORE)
        targets_BL[:, L - DIGITS :] = digits_BN
        return Batch(inputs_BL.astype(np.int32), targets_BL.astype(np.int32))
