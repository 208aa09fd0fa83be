"""MQAR's `min_gap`: every query lies more than min_gap tokens after its key, the labels stay right, no gap is
Zoology's layout unchanged, and a length without room for the gap is refused."""

import numpy as np
import pytest

from retention.data import IGNORE, MQAR


def query_distances(batch, D: int) -> np.ndarray:
    """For each labelled position, its distance to the position of the key it queries."""
    out = []
    for x, y in zip(batch.inputs, batch.targets):
        key_pos = {k: 2 * i for i, k in enumerate(x[0 : 2 * D : 2])}
        out += [p - key_pos[x[p]] for p in np.flatnonzero(y != IGNORE)]
    return np.array(out)


@pytest.mark.parametrize("min_gap,L", [(1, 66), (96, 256), (200, 4096)])
def test_every_query_is_farther_than_the_gap_and_labelled_right(min_gap, L):
    D = 16
    least = 4 * D + min_gap + min_gap % 2  # the shortest length with room for the gap: train there, eval at L
    data = MQAR(vocab_size=300, seq_len=least, batch_size=16, num_kv_pairs=D, min_gap=min_gap, seed=3)
    b = data.batch(2, seq_len=L, split="eval")
    dist = query_distances(b, D)
    assert len(dist) == 16 * D and dist.min() > min_gap
    for x, y in zip(b.inputs, b.targets):
        labelled = np.flatnonzero(y != IGNORE)
        assert labelled.min() >= 2 * D + min_gap and np.all(labelled % 2 == 0)
        pair = dict(zip(x[0 : 2 * D : 2], x[1 : 2 * D : 2]))
        assert all(y[p] == pair[x[p]] for p in labelled)


def test_without_a_gap_many_queries_sit_near_their_keys():
    """Zoology's power law (a = 0.01) puts a third of the queries within 48 tokens of their keys at T = 256: a
    small window answers them. min_gap=0 is the old generator, batch for batch."""
    kwargs = dict(vocab_size=300, seq_len=256, batch_size=64, num_kv_pairs=16, seed=1)
    b = MQAR(**kwargs).batch(0)
    assert np.mean(query_distances(b, 16) <= 48) > 1 / 3
    np.testing.assert_array_equal(MQAR(**kwargs, min_gap=0).batch(0).inputs, b.inputs)


def test_a_length_without_room_for_the_gap_is_refused():
    with pytest.raises(ValueError, match=r"seq_len must be even and >= 4 \* num_kv_pairs \+ min_gap .* = 82"):
        MQAR(vocab_size=300, seq_len=80, batch_size=2, num_kv_pairs=16, min_gap=17)
    with pytest.raises(ValueError, match="min_gap must be an int >= 0"):
        MQAR(vocab_size=300, seq_len=80, batch_size=2, num_kv_pairs=4, min_gap=-1)


def test_a_batchs_min_gap_replaces_the_generators():
    """A long-context eval's gap (thousands of tokens) on a generator made at its training length: every query of
    the batch is farther than it, far_fraction's rows take it, and without it the batch is the generator's own."""
    D, L, gap = 8, 2048, 1001  # an odd gap: rounded up to even
    data = MQAR(vocab_size=300, seq_len=64, batch_size=8, num_kv_pairs=D, min_gap=20, seed=2)
    far = data.batch(5, seq_len=L, split="eval", min_gap=gap)
    dist = query_distances(far, D)
    assert len(dist) == 8 * D and dist.min() > gap + 1
    assert (query_distances(data.batch(5, seq_len=L, split="eval"), D) <= gap).any()  # the generator's gap of 20
    np.testing.assert_array_equal(data.batch(5, seq_len=L, min_gap=20).inputs, data.batch(5, seq_len=L).inputs)
    mixed = MQAR(vocab_size=300, seq_len=64, batch_size=64, num_kv_pairs=D, far_fraction=0.5, seed=2)
    near = query_distances(mixed.batch(0, seq_len=L, min_gap=gap), D) <= gap
    assert 0.2 < near.mean() < 0.8  # about half the rows keep Zoology's layout
    with pytest.raises(ValueError, match="min_gap must be an int >= 0, got -2"):
        data.batch(0, seq_len=L, min_gap=-2)
    with pytest.raises(
        ValueError, match=r"seq_len must be even and >= 4 \* num_kv_pairs \+ min_gap .* \(2048\) = 2080"
    ):
        data.batch(0, seq_len=L, min_gap=2047)
