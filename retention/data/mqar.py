"""Multi-query associative recall (MQAR) as in Zoology (Arora et al., 2023, `multiquery_ar`).

Each row: D key-value pairs k1 v1 ... kD vD (keys from [1, V/2), values from [V/2, V), each drawn without
replacement), then the rest of the sequence, where each key appears once more as a query at an even offset
chosen with probability proportional to a * g^(a-1) (g = 1, 2, ... the offset's rank: a power law favouring
early offsets). The target at a query's position is the value paired with its key; every other target is
IGNORE, and every position that is not a pair or a query holds a random token.

`min_gap` (0: Zoology's layout) leaves at least that many tokens between the last pair and the first query, so
every query is more than `min_gap` tokens from its key: a model that sees only the last w tokens in each of n
layers cannot recall any key once min_gap >= n * (w - 1). With a = 0.01 and no gap, about half the queries fall
within sqrt(slots) offsets of the pairs, inside a window of a few dozen tokens.
"""

import numpy as np

from retention.data.base import IGNORE, Batch, rng_for
from retention.validation import check_int, check_number


class MQAR:
    """MQAR batches [batch_size, seq_len] over ids [0, vocab_size); `seq_len` is the training length."""

    def __init__(
        self,
        *,
        vocab_size: int = 128,
        seq_len: int,
        batch_size: int,
        num_kv_pairs: int = 4,
        power_a: float = 0.01,
        min_gap: int = 0,
        seed: int = 0,
    ):
        for name, value in (
            ("vocab_size", vocab_size),
            ("seq_len", seq_len),
            ("batch_size", batch_size),
            ("num_kv_pairs", num_kv_pairs),
        ):
            check_int(name, value)
        if vocab_size <= seq_len:
            raise ValueError(f"vocab_size must be > seq_len={seq_len} (as in Zoology), got {vocab_size}")
        if vocab_size // 2 - 1 < num_kv_pairs:
            raise ValueError(
                f"num_kv_pairs must be <= vocab_size // 2 - 1 = {vocab_size // 2 - 1} distinct keys, got {num_kv_pairs}"
            )
        check_number("power_a", power_a, low=0, high=1, open_low=True)
        check_int("min_gap", min_gap, low=0)
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.num_kv_pairs, self.power_a, self.seed = num_kv_pairs, power_a, seed
        self.gap = min_gap + min_gap % 2  # the first query slot's offset after the pairs (queries sit at even offsets)
        self.check_length("seq_len", seq_len)

    def check_length(self, name: str, seq_len: int) -> None:
        """seq_len must be even with 4 * num_kv_pairs + the gap <= seq_len (room for the pairs, the gap and the
        queries)."""
        check_int(name, seq_len)
        least = 4 * self.num_kv_pairs + self.gap
        if seq_len % 2 or least > seq_len:
            gap = f" + min_gap rounded up to even ({self.gap})" if self.gap else ""
            raise ValueError(f"{name} must be even and >= 4 * num_kv_pairs{gap} = {least}, got {seq_len}")

    def batch(self, index: int, *, seq_len: int | None = None, split: str = "train") -> Batch:
        """Batch `index` of `split`: inputs and targets [batch_size, seq_len] (targets: values at the queries)."""
        L = self.seq_len if seq_len is None else seq_len
        self.check_length("seq_len", L)
        rng = rng_for(self.seed, split, index, L)
        B, D, V = self.batch_size, self.num_kv_pairs, self.vocab_size
        keys_BD = np.stack([rng.choice(np.arange(1, V // 2), D, replace=False) for _ in range(B)])
        values_BD = np.stack([rng.choice(np.arange(V // 2, V), D, replace=False) for _ in range(B)])
        slots = (L - 2 * D - self.gap) // 2  # even offsets after the pairs and the gap where a query may go
        gaps = np.arange(1, slots + 1, dtype=np.float64)
        p = self.power_a * gaps ** (self.power_a - 1)
        offsets_BD = np.stack([rng.choice(slots, D, replace=False, p=p / p.sum()) for _ in range(B)])
        query_pos_BD = 2 * D + self.gap + 2 * offsets_BD

        inputs_BL = rng.integers(0, V, size=(B, L))
        inputs_BL[:, 0 : 2 * D : 2] = keys_BD
        inputs_BL[:, 1 : 2 * D : 2] = values_BD
        np.put_along_axis(inputs_BL, query_pos_BD, keys_BD, axis=1)
        targets_BL = np.full((B, L), IGNORE)
        np.put_along_axis(targets_BL, query_pos_BD, values_BD, axis=1)
        return Batch(inputs_BL.astype(np.int32), targets_BL.astype(np.int32))
