"""Multi-query associative recall (MQAR) as in Zoology (Arora et al., 2023, `multiquery_ar`).

Each row: D key-value pairs k1 v1 ... kD vD (keys from [1, V/2), values from [V/2, V), each drawn without
replacement), then the rest of the sequence, where each key appears once more as a query at an even offset
chosen with probability proportional to a * g^(a-1) (g = 1, 2, ... the offset's rank: a power law favouring
early offsets). The target at a query's position is the value paired with its key; every other target is
IGNORE, and every position that is not a pair or a query holds a filler token drawn by `filler`:
- "vocab" (Zoology's `random_non_queries`): uniform over the whole vocabulary, so about half of the filler are
  key ids (ids 1 to V/2 - 1) that a state may store as pairs (a delta rule overwrites its pair with them);
- "disjoint": uniform over [V/4, V/2), a range of its own (keys then come from [1, V/4));
- "values": uniform over the value range [V/2, V);
- "none": the token 0, which is never a key or a value.

`min_gap` (0: Zoology's layout) leaves at least that many tokens between the last pair and the first query, so
every query is more than `min_gap` tokens from its key: a model that sees only the last w tokens in each of n
layers cannot recall any key once min_gap >= n * (w - 1). With a = 0.01 and no gap, about half the queries fall
within sqrt(slots) offsets of the pairs, inside a window of a few dozen tokens. `far_fraction` (1: every row)
is the share of rows laid out with `min_gap`; the other rows have Zoology's layout (queries near and far mixed in
one batch).

Zoology's scales (vocabulary up to 8192, up to 64 pairs, T up to 512) are in range.
"""

import numpy as np

from retention.data.base import IGNORE, Batch, rng_for
from retention.validation import check_choice, check_int, check_number

FILLERS = ("vocab", "disjoint", "values", "none")  # what fills the positions that are not pairs or queries


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
        far_fraction: float = 1.0,
        filler: str = "vocab",
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
        check_choice("filler", filler, FILLERS)
        self.key_end = vocab_size // 4 if filler == "disjoint" else vocab_size // 2  # keys are [1, key_end)
        if self.key_end - 1 < num_kv_pairs:
            raise ValueError(
                f"num_kv_pairs must be <= {self.key_end - 1} distinct keys (vocab_size={vocab_size}, "
                f"filler={filler!r}), got {num_kv_pairs}"
            )
        check_number("power_a", power_a, low=0, high=1, open_low=True)
        check_int("min_gap", min_gap, low=0)
        check_number("far_fraction", far_fraction, low=0, high=1)
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.num_kv_pairs, self.power_a, self.seed = num_kv_pairs, power_a, seed
        self.far_fraction, self.filler = far_fraction, filler
        self.gap = min_gap + min_gap % 2  # the first query slot's offset after the pairs (queries sit at even offsets)
        self.check_length("seq_len", seq_len)

    def check_length(self, name: str, seq_len: int, gap: int | None = None) -> None:
        """seq_len must be even with 4 * num_kv_pairs + the gap (min_gap rounded up to even; `gap` when given)
        <= seq_len (room for the pairs, the gap and the queries)."""
        check_int(name, seq_len)
        gap = self.gap if gap is None else gap
        least = 4 * self.num_kv_pairs + gap
        if seq_len % 2 or least > seq_len:
            named = f" + min_gap rounded up to even ({gap})" if gap else ""
            raise ValueError(f"{name} must be even and >= 4 * num_kv_pairs{named} = {least}, got {seq_len}")

    def batch(
        self, index: int, *, seq_len: int | None = None, split: str = "train", min_gap: int | None = None
    ) -> Batch:
        """Batch `index` of `split`: inputs and targets [batch_size, seq_len] (targets: values at the queries).
        `min_gap` replaces the generator's for this batch (a long-context eval's gap of thousands of tokens, where
        the generator's is the training length's); the rows laid out with it are far_fraction's as ever."""
        L = self.seq_len if seq_len is None else seq_len
        if min_gap is not None:
            check_int("min_gap", min_gap, low=0)
        gap = self.gap if min_gap is None else min_gap + min_gap % 2
        self.check_length("seq_len", L, gap)
        rng = rng_for(self.seed, split, index, L)
        B, D, V = self.batch_size, self.num_kv_pairs, self.vocab_size
        keys_BD = np.stack([rng.choice(np.arange(1, self.key_end), D, replace=False) for _ in range(B)])
        values_BD = np.stack([rng.choice(np.arange(V // 2, V), D, replace=False) for _ in range(B)])
        gap_B = np.full(B, gap)
        if self.far_fraction < 1:
            gap_B = np.where(rng.random(B) < self.far_fraction, gap, 0)
        offsets_BD = np.stack([self._query_offsets(rng, (L - 2 * D - gap) // 2) for gap in gap_B])
        query_pos_BD = 2 * D + gap_B[:, None] + 2 * offsets_BD

        inputs_BL = self._filler(rng, (B, L))
        inputs_BL[:, 0 : 2 * D : 2] = keys_BD
        inputs_BL[:, 1 : 2 * D : 2] = values_BD
        np.put_along_axis(inputs_BL, query_pos_BD, keys_BD, axis=1)
        targets_BL = np.full((B, L), IGNORE)
        np.put_along_axis(targets_BL, query_pos_BD, values_BD, axis=1)
        return Batch(inputs_BL.astype(np.int32), targets_BL.astype(np.int32))

    def _query_offsets(self, rng: np.random.Generator, slots: int) -> np.ndarray:
        """num_kv_pairs distinct query slots among `slots` even offsets after the pairs and the gap, by the power
        law (module docstring)."""
        gaps = np.arange(1, slots + 1, dtype=np.float64)
        p = self.power_a * gaps ** (self.power_a - 1)
        return rng.choice(slots, self.num_kv_pairs, replace=False, p=p / p.sum())

    def _filler(self, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        """Filler tokens of `shape` by `self.filler` (module docstring)."""
        V = self.vocab_size
        if self.filler == "none":
            return np.zeros(shape, np.int64)
        low, high = {"vocab": (0, V), "disjoint": (V // 4, V // 2), "values": (V // 2, V)}[self.filler]
        return rng.integers(low, high, size=shape)
