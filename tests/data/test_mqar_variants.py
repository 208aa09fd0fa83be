"""MQAR's variants: the filler's source (`filler`), near and far queries mixed in one batch (`far_fraction`) and
Zoology's scales. Each batch is read back position by position: which ids fill the sequence, where each query sits
against its key, and whether every label is the value paired with the query's key."""

import numpy as np
import pytest

from retention.data import IGNORE, MQAR
from tests.data.test_mqar_min_gap import query_distances

V, D, L = 128, 4, 64


def filler_ids(batch, pairs: int) -> np.ndarray:
    """The ids at every position that is neither a pair nor a query."""
    mask = np.ones(batch.inputs.shape, bool)
    mask[:, : 2 * pairs] = False
    mask &= batch.targets == IGNORE
    return batch.inputs[mask]


def assert_labelled_right(batch, pairs: int) -> None:
    for x, y in zip(batch.inputs, batch.targets):
        pair = dict(zip(x[0 : 2 * pairs : 2], x[1 : 2 * pairs : 2]))
        labelled = np.flatnonzero(y != IGNORE)
        assert len(labelled) == pairs and all(y[p] == pair[x[p]] for p in labelled)


@pytest.mark.parametrize(
    "filler, allowed",
    [("vocab", (0, V)), ("disjoint", (V // 4, V // 2)), ("values", (V // 2, V)), ("none", (0, 1))],
)
def test_the_filler_comes_from_its_range_and_keys_never_repeat_outside_their_pair(filler, allowed):
    data = MQAR(vocab_size=V, seq_len=L, batch_size=64, num_kv_pairs=D, min_gap=48, filler=filler, seed=2)
    b = data.batch(3, split="eval")
    ids = filler_ids(b, D)
    assert ids.min() >= allowed[0] and ids.max() < allowed[1]
    distinct = len(np.unique(ids))
    assert distinct == 1 if filler == "none" else distinct > (allowed[1] - allowed[0]) // 2  # drawn, not fixed
    keys = b.inputs[:, 0 : 2 * D : 2]
    key_range = V // 4 if filler == "disjoint" else V // 2
    assert keys.min() >= 1 and keys.max() < key_range
    if filler != "vocab":  # no filler position holds a key id: a state sees each key twice, at its pair and query
        assert not np.isin(ids, np.arange(1, key_range)).any()
    else:  # Zoology's: about half of the filler are key ids (63 of the 128 ids)
        assert 0.4 < np.isin(ids, np.arange(1, V // 2)).mean() < 0.6
    assert_labelled_right(b, D)


def test_far_fraction_mixes_far_and_near_rows():
    """With far_fraction 0.5 about half the rows keep every query past min_gap; the others have Zoology's layout,
    with queries inside the gap; 1 is every row far, 0 none."""
    kwargs = dict(vocab_size=V, seq_len=L, batch_size=256, num_kv_pairs=D, min_gap=40, seed=5)
    b = MQAR(**kwargs, far_fraction=0.5).batch(0)
    first_query = np.array([np.flatnonzero(y != IGNORE).min() for y in b.targets])
    far = first_query >= 2 * D + 40
    assert 0.4 < far.mean() < 0.6
    assert_labelled_right(b, D)
    assert query_distances(MQAR(**kwargs, far_fraction=1.0).batch(0), D).min() > 40
    assert query_distances(MQAR(**kwargs, far_fraction=0.0).batch(0), D).min() < 40


def test_the_defaults_are_zoologys_generator_batch_for_batch():
    """filler="vocab" and far_fraction=1 draw exactly what the generator drew before either existed."""
    kwargs = dict(vocab_size=V, seq_len=L, batch_size=8, num_kv_pairs=D, min_gap=48, seed=3)
    a, b = MQAR(**kwargs).batch(4), MQAR(**kwargs, filler="vocab", far_fraction=1.0).batch(4)
    np.testing.assert_array_equal(a.inputs, b.inputs)
    np.testing.assert_array_equal(a.targets, b.targets)


def test_zoologys_largest_cell():
    """Vocabulary 8192, 64 pairs, T = 512: labelled right, the queries at even offsets after the pairs."""
    b = MQAR(vocab_size=8192, seq_len=512, batch_size=8, num_kv_pairs=64, filler="values", seed=0).batch(1)
    assert b.inputs.shape == (8, 512) and b.inputs.max() < 8192
    assert_labelled_right(b, 64)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(filler="keys"), r"filler must be one of \('vocab', 'disjoint', 'values', 'none'\)"),
        (dict(far_fraction=1.5), r"far_fraction must be a finite number in \[0, 1\]"),
        (dict(filler="disjoint", num_kv_pairs=32), r"num_kv_pairs must be <= 31 distinct keys .*filler='disjoint'"),
    ],
)
def test_bad_variants_are_refused_by_name(kwargs, words):
    with pytest.raises(ValueError, match=words):
        MQAR(**{"vocab_size": V, "seq_len": L, "batch_size": 2, "num_kv_pairs": D, **kwargs})
