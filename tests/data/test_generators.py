"""Each generator's invariants on fresh seeds: MQAR labels exactly at the queried keys, passkey digits at the
needle, copy targets in order, text bytes round-trip; every batch a pure function of (seed, split, index)."""

import numpy as np
import pytest

from retention.data import IGNORE, MQAR, Passkey, SelectiveCopy, Text, prefetch
from retention.data import passkey as pk
from retention.data import selective_copy as sc

SEEDS = np.random.SeedSequence().generate_state(3)  # fresh every session


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("L", [16, 64, 256])
def test_mqar(seed, L):
    V, D = 300, 4
    data = MQAR(vocab_size=V, seq_len=64, batch_size=8, num_kv_pairs=D, seed=int(seed))
    b = data.batch(5, seq_len=L)
    assert b.inputs.shape == b.targets.shape == (8, L) and b.inputs.dtype == np.int32
    for x, y in zip(b.inputs, b.targets):
        keys, values = x[0 : 2 * D : 2], x[1 : 2 * D : 2]
        assert len(set(keys)) == D and len(set(values)) == D
        assert np.all((1 <= keys) & (keys < V // 2)) and np.all((V // 2 <= values) & (values < V))
        labelled = np.flatnonzero(y != IGNORE)
        assert len(labelled) == D and np.all(labelled >= 2 * D) and np.all(labelled % 2 == 0)
        pair = dict(zip(keys, values))
        assert sorted(x[labelled]) == sorted(keys)  # each key queried once
        assert all(y[p] == pair[x[p]] for p in labelled)
        assert np.all((0 <= x) & (x < V))
    np.testing.assert_array_equal(data.batch(5, seq_len=L).inputs, b.inputs)
    assert not np.array_equal(data.batch(6, seq_len=L).inputs, b.inputs)
    assert not np.array_equal(data.batch(5, seq_len=L, split="eval").inputs, b.inputs)


def test_mqar_queries_favour_early_offsets():
    """The power law a*g^(a-1) puts more queries in the first half of the offsets than in the second."""
    data = MQAR(vocab_size=600, seq_len=512, batch_size=64, num_kv_pairs=8, seed=int(SEEDS[0]))
    pos = np.flatnonzero(data.batch(0).targets.ravel() != IGNORE) % 512
    assert np.mean(pos < 16 + (512 - 16) // 2) > 0.6


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("depth", [None, 0.0, 0.5, 1.0])
def test_passkey(seed, depth):
    L = 100
    data = Passkey(seq_len=L, batch_size=6, seed=int(seed))
    b = data.batch(3, depth=depth, split="eval")
    for x, y in zip(b.inputs, b.targets):
        marks = np.flatnonzero(x == pk.MARK)
        assert len(marks) == 2 and marks[1] - marks[0] == pk.DIGITS + 1
        digits = x[marks[0] + 1 : marks[1]]
        assert np.all(digits < 10)
        np.testing.assert_array_equal(y[L - 5 :], digits)
        assert np.all(y[: L - 5] == IGNORE)
        assert x[L - 5] == pk.QUERY and np.array_equal(x[L - 4 :], digits[:4])
        if depth == 0.0:
            assert marks[0] == 0
        if depth == 1.0:
            assert marks[1] == L - 6  # the needle ends right before the query
        filler = np.ones(L, bool)
        filler[marks[0] : marks[1] + 1] = False
        filler[L - 5 :] = False
        assert np.all(x[filler] == pk.FIRST_FILLER + np.arange(L)[filler] % data.n_filler)


@pytest.mark.parametrize("seed", SEEDS)
def test_selective_copy(seed):
    L, M = 40, 6
    data = SelectiveCopy(seq_len=L, batch_size=8, num_copy=M, n_tokens=10, seed=int(seed))
    b = data.batch(2)
    for x, y in zip(b.inputs, b.targets):
        content = x[: L - M][x[: L - M] != sc.NOISE]
        assert len(content) == M and np.all(content >= sc.FIRST_TOKEN) and np.all(content < data.vocab_size)
        assert np.all(x[L - M :] == sc.MARKER)
        np.testing.assert_array_equal(y[L - M :], content)
        assert np.all(y[: L - M] == IGNORE)


def test_prefetch_matches_and_raises():
    data = MQAR(vocab_size=100, seq_len=32, batch_size=2, num_kv_pairs=2, seed=1)
    got = list(prefetch(data.batch, 3, 9, size=2))
    assert len(got) == 6
    for i, b in zip(range(3, 9), got):
        np.testing.assert_array_equal(b.inputs, data.batch(i).inputs)

    def broken(i):
        if i == 2:
            raise RuntimeError("bad batch")
        return data.batch(i)

    with pytest.raises(RuntimeError, match="bad batch"):
        list(prefetch(broken, 0, 5))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: MQAR(vocab_size=64, seq_len=64, batch_size=2, num_kv_pairs=4), "vocab_size must be > seq_len"),
        (lambda: MQAR(vocab_size=100, seq_len=30, batch_size=2, num_kv_pairs=8), "seq_len must be even"),
        (lambda: Passkey(seq_len=10, batch_size=2), "seq_len must be >= 14"),
        (lambda: SelectiveCopy(seq_len=10, batch_size=2, num_copy=6), "seq_len must be >= 2 \\* num_copy"),
        (lambda: Text(seq_len=8, batch_size=2, path=__file__), "path must be a folder"),  # a file, not a folder
        (lambda: Text(seq_len=8, batch_size=2, eval_fraction=1.0), r"eval_fraction .* \(0, 1\), got 1.0"),
        (lambda: MQAR(vocab_size=100, seq_len=32, batch_size=2, num_kv_pairs=2, power_a=0), r"power_a .* \(0, 1\]"),
        (lambda: Passkey(seq_len=32, batch_size=2, depths=[0.5, 1.5]), r"depths\[i\] .* \[0, 1\], got 1.5"),
        (lambda: Passkey(seq_len=32, batch_size=2).batch(0, depth=-0.1), r"depth must .* \[0, 1\], got -0.1"),
        (lambda: Passkey(seq_len=32, batch_size=True), "batch_size must be an int >= 1, got True"),
        (lambda: SelectiveCopy(seq_len=32, batch_size=2).batch(-1), "index must be an int >= 0, got -1"),
        (lambda: SelectiveCopy(seq_len=32, batch_size=2).batch(0, split="test"), "split must be one of"),
        (lambda: list(prefetch(lambda i: i, 0, 2, size=0)), "size must be an int >= 1, got 0"),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()
