"""Text evaluation: the loss by position bucket and bits per byte against hand and loop oracles, the eval step's
per-position sums against a float64 reference, and short text runs writing the new eval tags and summary fields
(a BPE run keeps its tokenizer in the run folder and a resumed run reuses it)."""

import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest

from retention.data import IGNORE
from retention.train import train
from retention.train.evaluate import bits_per_byte, bucket_losses, position_buckets, target_bytes
from retention.train.step import masked_sums
from tests.train.common import TINY, compose_config, event_tags, fresh_seed

SEED = int(np.random.SeedSequence().generate_state(1)[0])


def labelled(rng, B: int, T: int, V: int, p_ignore: float = 0.3):
    """Targets [B, T] over V ids with IGNORE at about p_ignore of the positions."""
    targets = rng.integers(0, V, size=(B, T))
    return np.where(rng.random((B, T)) < p_ignore, IGNORE, targets)


@pytest.mark.parametrize("T", [1, 2, 5, 16, 48])
def test_bucket_losses_match_a_loop_oracle(T):
    rng = np.random.default_rng([SEED, T])
    B = 3
    nll = rng.exponential(2.0, size=(B, T))
    targets = labelled(rng, B, T, 10)
    mask = targets != IGNORE
    sums, counts = {}, {}
    for b in range(B):
        for t in range(T):
            lo = 0 if t == 0 else 2 ** int(math.floor(math.log2(t)))
            hi = min(max(2 * lo, 1), T)
            key = f"loss_pos_{lo}_{hi}"
            sums.setdefault(key, 0.0)
            counts.setdefault(key, 0)
            if mask[b, t]:
                sums[key] += nll[b, t]
                counts[key] += 1
    expected = {k: sums[k] / counts[k] if counts[k] else math.nan for k in sums}
    got = bucket_losses(np.where(mask, nll, 0).sum(0), mask.sum(0))
    assert list(got) == [f"loss_pos_{lo}_{hi}" for lo, hi in position_buckets(T)] and set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12, nan_ok=True), key


def test_position_buckets_by_hand():
    assert position_buckets(16) == [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16)]
    assert position_buckets(48)[-2:] == [(16, 32), (32, 48)]
    assert math.isnan(bucket_losses(np.array([1.0, 0.0]), np.array([1.0, 0.0]))["loss_pos_1_2"])  # no label


def test_bits_per_byte_by_hand():
    token_bytes = np.array([1, 3, 2, 1])  # id 1 stands for 3 bytes, id 2 for 2
    targets = np.array([[0, 2, IGNORE], [1, IGNORE, 3]])
    assert target_bytes(targets, token_bytes) == 1 + 2 + 3 + 1
    assert bits_per_byte(7 * math.log(2), 7) == pytest.approx(1.0, rel=1e-15)
    assert bits_per_byte(14 * math.log(2), 7) == pytest.approx(2.0, rel=1e-15)
    assert math.isnan(bits_per_byte(1.0, 0))


def test_per_position_sums_match_float64():
    rng = np.random.default_rng(SEED)
    B, T, V = 3, 7, 11
    logits = rng.normal(size=(B, T, V)) * 3
    targets = labelled(rng, B, T, V)
    sums = masked_sums(jnp.asarray(logits, jnp.float32), jnp.asarray(targets))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    mask = targets != IGNORE
    nll = -np.take_along_axis(logp, np.where(mask, targets, 0)[..., None], -1)[..., 0]
    np.testing.assert_allclose(sums["nll_T"], np.where(mask, nll, 0).sum(0), rtol=2e-5)
    np.testing.assert_array_equal(sums["labels_T"], mask.sum(0))
    assert float(sums["nll"]) == pytest.approx(float(np.where(mask, nll, 0).sum()), rel=2e-5)


TEXT = [o for o in TINY if not o.startswith(("data.vocab_size", "data.num_kv_pairs"))]


def text_run(tmp_path, extra: list[str]) -> list[str]:
    """Overrides of a tiny text run over a folder of documents written under tmp_path."""
    rng = np.random.default_rng(SEED)
    docs = tmp_path / "docs"
    if not docs.exists():
        docs.mkdir()
        words = ["def ", "return ", "x", " = ", "1\n", "(a, b)", "héllo ", "✓"]
        for i in range(30):
            (docs / f"{i}.py").write_text("".join(rng.choice(words, 200)))
    return [
        *TEXT,
        "data=text",
        f"data.path={docs}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.eval_fraction=0.3",
        "trainer.ckpt_every=100",
        f"seed={fresh_seed()}",
        *extra,
    ]


@pytest.mark.integration
def test_text_run_writes_bits_per_byte_and_position_losses(tmp_path):
    run = tmp_path / "run"
    summary = train(compose_config(text_run(tmp_path, ["trainer.steps=3"])), str(run))
    buckets = [f"loss_pos_{lo}_{hi}" for lo, hi in position_buckets(32)]
    assert buckets[-1] == "loss_pos_16_32"
    for length in ("16", "32"):
        values = summary["eval"][length]
        # the bytes tokenizer: one byte per target (EOD counted as one), so bits per byte is loss / ln 2
        assert values["bits_per_byte"] == pytest.approx(values["loss"] / math.log(2), rel=1e-5)
        names = [k for k in values if k.startswith("loss_pos_")]
        assert names == buckets[: len(names)] and names[-1].endswith(f"_{length}")
        assert all(np.isfinite(values[k]) for k in names)
    assert json.load(open(run / "summary.json")) == summary
    tags = event_tags(run / "tb")
    assert {"eval/x1/bits_per_byte", "eval/x2/bits_per_byte", "eval/x1/loss_pos_8_16", "eval/x2/loss_pos_16_32"} <= tags
    assert not (run / "tokenizer.json").exists()  # bytes: nothing to keep


@pytest.mark.integration
def test_bpe_run_keeps_its_tokenizer_and_resumes_with_it(tmp_path):
    run = tmp_path / "run"
    extra = ["data.tokenizer=bpe", "data.vocab_size=300", "trainer.ckpt_every=2", "trainer.eval_scales=[1]"]
    overrides = text_run(tmp_path, extra)
    first = train(compose_config([*overrides, "trainer.steps=2"]), str(run))
    saved = (run / "tokenizer.json").read_text()
    os.remove(
        next(p for p in (tmp_path / "cache").iterdir() if p.name.endswith("tokenizer.json"))
    )  # the run's own copy rules
    resumed = train(compose_config([*overrides, "trainer.steps=3"]), str(run))
    assert resumed["resumed_from"] == 2 and (run / "tokenizer.json").read_text() == saved
    assert 257 < len(json.loads(saved)["model"]["vocab"]) <= 300  # EOD, the 256 bytes and merges
    for summary in (first, resumed):
        values = summary["eval"]["16"]
        assert np.isfinite(values["bits_per_byte"]) and values["bits_per_byte"] < values["loss"] / math.log(2)
