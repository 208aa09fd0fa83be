"""The long-context reader (experiments/long_context/reader.py) against an independent oracle: for a tiny random LM
of each mixer kind and a hybrid, both paths (one compiled forward; a prefill then decode steps carrying the caches)
give the per-position nll of one plain full forward over the whole 300-token sequence, computed here in float64
from its logits; and the loss by position (position.py) sums to the plain per-token sum in every bucket."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.long_context.position import position_losses
from experiments.long_context.reader import make_reader
from retention.data.documents import Document
from retention.nn import LM, LMConfig, decode_cache_bytes
from retention.train.evaluate import position_buckets
from tests.helpers import rel_err

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration

SEED = int(np.random.SeedSequence().generate_state(1)[0] % 2**31)
V, T, SEGMENT = 37, 300, 64  # 300 = 4 steps of 64 after the prefill, then a step of 44
PATTERNS = {"A": "A", "W": "W", "P": "P", "D": "D", "M": "M", "hybrid": "PWDA"}


def tiny_lm(pattern: str, seed: int) -> LM:
    """A random LM of `pattern` (4 layers for the hybrid, else 2): a window of 16 tokens, chunks of 16, a short
    convolution, QK-norm."""
    config = LMConfig(
        vocab_size=V,
        d_model=32,
        n_layers=max(2, len(pattern)),
        pattern=pattern,
        n_heads=2,
        n_kv_heads=2,
        head_dim=16,
        window=16,
        chunk_size=16,
        conv_size=4,
        qk_norm=True,
        ssm_state_size=16,
    )
    return LM(config, rngs=nnx.Rngs(seed))


_logits = nnx.jit(lambda model, tokens: model(tokens))  # compiled once per model and shape


def plain_nll(model: LM, tokens_1T: np.ndarray) -> np.ndarray:
    """The oracle: one plain full forward over the whole row, then each position's nll of the next token in
    float64 (log-sum-exp of the logits minus the target's logit) [T - 1]."""
    logits = np.asarray(_logits(model, jnp.asarray(tokens_1T[:, :-1])), np.float64)[0]
    top = logits.max(axis=-1, keepdims=True)
    logz = np.log(np.exp(logits - top).sum(axis=-1)) + top[:, 0]
    return logz - logits[np.arange(logits.shape[0]), tokens_1T[0, 1:]]


@pytest.mark.parametrize("name", list(PATTERNS))
def test_both_paths_give_the_plain_forwards_nll_at_every_position(name):
    model = tiny_lm(PATTERNS[name], SEED)
    tokens = np.random.default_rng(SEED).integers(0, V, (1, T + 1)).astype(np.int32)
    want_T = plain_nll(model, tokens)
    inputs, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
    for path in ("forward", "carry"):
        reader = make_reader(model, 1, T, path=path, segment=SEGMENT)
        assert reader.path == path
        got = jax.device_get(reader.sums(inputs, targets))
        assert rel_err(got["nll_T"], want_T) < 2e-5, (name, path)
        assert np.abs(got["nll_T"] - want_T).max() < 1e-4, (name, path)
        assert got["labels_T"].tolist() == [1.0] * T and float(got["nll"]) == pytest.approx(want_T.sum(), rel=1e-5)
    # The check can fail: the tokens just before a segment's end move the nll after it by far more than the
    # tolerance (a path that dropped the caches at the boundary would not see them).
    changed = tokens.copy()
    changed[0, SEGMENT - 4 : SEGMENT] = (changed[0, SEGMENT - 4 : SEGMENT] + 1) % V
    moved = np.abs(plain_nll(model, changed) - want_T)[SEGMENT : SEGMENT + 8].max()
    assert moved > 100 * 1e-4, (name, moved)


def test_auto_reads_by_carry_when_the_forward_needs_more_than_allowed():
    model = tiny_lm("PA", SEED)
    roomy = make_reader(model, 1, T, path="auto")
    squeezed = make_reader(model, 1, T, path="auto", max_bytes=1)
    assert roomy.path == "forward" and squeezed.path == "carry" and squeezed.forward is None
    assert squeezed.forward_bytes == roomy.forward_bytes > 0  # measured, then left for the carry path (segment: L)
    cost = squeezed.cost()
    assert cost["segment"] == T and cost["cache_bytes"] == decode_cache_bytes(model.config, 1, T)
    assert roomy.cost()["segment"] is None


def test_bucket_sums_equal_the_plain_per_token_sums():
    model = tiny_lm("PA", SEED)
    rng = np.random.default_rng(SEED + 1)
    L = 200
    documents = [Document(f"doc{i}", 0, "", rng.integers(0, V, L + 1 + i).astype(np.int32)) for i in range(3)]
    token_bytes = rng.integers(1, 4, V)
    out = position_losses(make_reader(model, 1, L, path="forward").sums, L, documents, token_bytes)
    want_T = sum(plain_nll(model, d.ids[None, : L + 1]) for d in documents)  # summed over the documents
    bytes_T = sum(token_bytes[d.ids[1 : L + 1]] for d in documents)
    assert [(b["lo"], b["hi"]) for b in out["buckets"]] == position_buckets(L)
    for b in out["buckets"]:
        lo, hi = b["lo"], b["hi"]
        assert b["tokens"] == 3 * (hi - lo) and b["bytes"] == bytes_T[lo:hi].sum()
        assert b["nll"] == pytest.approx(want_T[lo:hi].sum(), rel=1e-5)
        assert b["loss"] == pytest.approx(want_T[lo:hi].sum() / (3 * (hi - lo)), rel=1e-5)
        assert b["bits_per_byte"] == pytest.approx(want_T[lo:hi].sum() / np.log(2) / bytes_T[lo:hi].sum(), rel=1e-5)
    assert sum(b["nll"] for b in out["buckets"]) == pytest.approx(want_T.sum(), rel=1e-5)
    assert out["tokens"] == 3 * L and out["documents"] == 3 and len(out["document_seconds"]) == 3


def test_bad_arguments_are_named():
    model = tiny_lm("P", SEED)
    with pytest.raises(ValueError, match=r"path must be one of .*got 'full'"):
        make_reader(model, 1, T, path="full")
    with pytest.raises(ValueError, match=r"segment must be an int >= 1, got 0"):
        make_reader(model, 1, T, segment=0)
    reader = make_reader(model, 1, 16, path="carry")
    with pytest.raises(ValueError, match=r"inputs and targets must be \[1, 16\]"):
        reader.sums(jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 8), jnp.int32))
    short = [Document("short", 0, "", np.zeros(10, np.int32))]
    with pytest.raises(ValueError, match=r"documents must have at least L \+ 1 = 17 ids, got \['short'\]"):
        position_losses(reader.sums, 16, short, np.ones(V, np.int64))
