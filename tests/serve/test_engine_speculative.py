"""Speculative decoding inside the Engine: greedy with a draft equals the target's `generate` run alone per request
(P, A and a hybrid target; a smaller differently-seeded draft, about none accepted, and the target as its own draft,
every draft accepted), with more requests than slots, prompts of different lengths and requests stopping mid-round
at their eos or max_new_tokens; 4 slots serve 32 requests at once with the prefix cache and speculation on, each equal
to its run alone; sampled with a draft, the first three tokens have the target's own sampling distribution (chi-square
against the exact distribution from the target's logits, temperature and top_k applied); the stats; bad input refused
before any work."""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention import generate, prefill
from retention.nn import LM, LMConfig
from retention.serve.engine import Engine
from retention.serve.sampling import sampling_probabilities
from retention.serve.speculative_round import SpeculationStats

pytestmark = pytest.mark.integration  # the serving layer (retention.serve, snapshots): make test-integration

BASE = LMConfig(
    vocab_size=61, d_model=32, n_layers=2, pattern="P", n_heads=4, n_kv_heads=2, head_dim=8, window=5,
    ssm_state_size=4,
)  # fmt: skip
MAX_LEN, K = 40, 3


def model_of(pattern: str, seed: int = 0, **changes) -> LM:
    config = dataclasses.replace(BASE, pattern=pattern, conv_size=4 if len(pattern) > 1 else 0, **changes)
    return LM(config, rngs=nnx.Rngs(seed))


def small_draft() -> LM:
    return model_of("P", seed=1, n_layers=1)  # smaller and differently seeded: few of its tokens are accepted


def prompt(seed: int, T: int) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (1, T), 0, BASE.vocab_size, dtype=jnp.int32)


def alone(model: LM, prompt_1T, n: int) -> list[int]:
    """The request's greedy tokens, run alone by `generate` (the oracle)."""
    return np.asarray(generate(model, prompt_1T, n, temperature=0.0).tokens[0, prompt_1T.shape[1] :]).tolist()


@pytest.mark.parametrize(
    "pattern, draft",
    [
        ("PA", "small"),
        ("A", "itself"),
        *(pytest.param(p, d, marks=pytest.mark.slow) for p, d in [("P", "small"), ("P", "itself"), ("A", "small")]),
        pytest.param("PA", "itself", marks=pytest.mark.slow),
    ],
)
def test_greedy_with_a_draft_equals_the_targets_run_alone(pattern, draft):
    target = model_of(pattern)
    lengths, news = (3, 9, 5, 12, 7), (9, 4, 11, 6, 10)
    prompts = [prompt(10 + i, T) for i, T in enumerate(lengths)]
    expected = [alone(target, p, n) for p, n in zip(prompts, news)]
    eos = expected[2][4]  # request 2 stops at its first `eos`, in the middle of a round
    stop = expected[2].index(eos) + 1
    expected[2] = expected[2][:stop]
    engine = Engine(
        target, slots=2, max_len=MAX_LEN, draft=target if draft == "itself" else small_draft(), draft_tokens=K
    )
    ids = [
        engine.submit(p, max_new_tokens=n, eos_id=eos if i == 2 else None)
        for i, (p, n) in enumerate(zip(prompts, news))
    ]
    assert engine.waiting == [2, 3, 4]
    streamed: dict[int, list[int]] = {}
    for request_id, token in engine.stream():
        streamed.setdefault(request_id, []).append(token)
    assert [streamed[i] for i in ids] == expected  # never a token past a stop
    assert [engine.finished[i] for i in ids] == expected
    stats = engine.speculation_stats()
    assert stats.draft_tokens == K and stats.proposed == K * stats.verified and stats.rounds <= stats.verified
    assert stats.tokens_per_target_step == pytest.approx(1 + K * stats.acceptance_rate)
    if draft == "itself":  # every draft accepted: k + 1 tokens a target step
        assert stats.acceptance_rate == 1.0 and stats.tokens_per_target_step == K + 1
    else:
        assert stats.acceptance_rate < 0.5


def test_four_slots_serve_32_requests_at_once_with_prefix_reuse_and_speculation():
    target = model_of("PA")
    system, other = prompt(50, 8), prompt(51, 12)
    tails = [prompt(60 + i, 3) for i in range(32)]  # few shapes: few programs to compile for the oracle
    prompts = [jnp.concatenate([system if i % 4 else other, tails[i]], axis=1) for i in range(32)]
    news = [4 + i % 3 for i in range(32)]
    engine = Engine(
        target,
        slots=4,
        max_len=MAX_LEN,
        prefix_cache_bytes=1 << 30,
        prefix_block=4,
        draft=small_draft(),
        draft_tokens=K,
    )
    ids = [engine.submit(p, max_new_tokens=n) for p, n in zip(prompts, news)]
    finished = engine.run()
    stats = engine.cache_stats()
    assert stats.hits == 30 and stats.misses == 2 and stats.tokens_reused == 23 * 8 + 7 * 12
    assert engine.draft_prefix_cache.stats().hits == 30  # the draft's prompts reuse their prefixes too
    assert engine.speculation_stats().verified > 0
    assert [finished[i] for i in ids] == [alone(target, p, n) for p, n in zip(prompts, news)]


V, TEMPERATURE, TOP_K, N_SAMPLES = 8, 0.7, 6, 2048
SMALL = LMConfig(vocab_size=V, d_model=16, n_layers=1, pattern="P", n_heads=2, n_kv_heads=1, head_dim=8)
CHI2_Z = 3.719  # the standard normal's upper 1e-4 quantile


def exact_first_tokens(model: LM, prompt_1T) -> np.ndarray:
    """The exact probability of each first three tokens [V, V, V] that the sampler gives `model` after the prompt:
    the product of its sampling distributions (temperature and top_k applied) after each prefix."""
    T = prompt_1T.shape[1]
    two = jnp.array(list(itertools.product(range(V), repeat=2)), jnp.int32)  # every (x0, x1), x0 major
    logits = model(jnp.concatenate([jnp.broadcast_to(prompt_1T, (V * V, T)), two], axis=1))[:, T - 1 : T + 2]
    p = np.asarray(sampling_probabilities(logits, TEMPERATURE, TOP_K), np.float64)  # [V * V, 3, V]
    return p[0, 0][:, None, None] * p[::V, 1][:, :, None] * p[:, 2].reshape(V, V, V)


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """(Pearson's chi-square of the counts against the probabilities, its 1e-4 critical value): cells expecting
    fewer than 5 pooled into one; Wilson-Hilferty's approximation of the chi-square quantile."""
    counts, expected = counts.ravel(), probs.ravel() * counts.sum() / probs.sum()
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    observed, expected = observed[expected > 0], expected[expected > 0]
    df = len(expected) - 1
    critical = df * (1 - 2 / (9 * df) + CHI2_Z * math.sqrt(2 / (9 * df))) ** 3
    return float(((observed - expected) ** 2 / expected).sum()), critical


def test_sampled_tokens_with_a_draft_have_the_targets_distribution():
    target, draft = LM(SMALL, rngs=nnx.Rngs(0)), LM(SMALL, rngs=nnx.Rngs(5))
    prompt_1T = jnp.array([[1, 5, 2, 7]], jnp.int32)
    engine = Engine(target, slots=N_SAMPLES // 2, max_len=16, draft=draft, draft_tokens=2)
    start, draft_start = prefill(target, prompt_1T, max_len=16, step_tokens=3), prefill(draft, prompt_1T, max_len=16)
    for i in range(N_SAMPLES):
        engine.submit(
            start,
            draft_start=draft_start,
            max_new_tokens=3,
            temperature=TEMPERATURE,
            top_k=TOP_K,
            key=jax.random.key(i),
        )
    counts = np.zeros((V, V, V))
    for tokens in engine.run().values():
        counts[tuple(tokens)] += 1
    want, drafts = exact_first_tokens(target, prompt_1T), exact_first_tokens(draft, prompt_1T)
    assert counts[want == 0].sum() == 0  # never a token outside the target's top_k
    stats = engine.speculation_stats()
    assert 0.1 < stats.acceptance_rate < 0.9  # drafts both accepted and rejected
    for axis in (2, 0):  # (x0, x1): x1 the first speculative token; (x1, x2)
        statistic, critical = chi_square(counts.sum(axis), want.sum(axis))
        assert statistic < critical, (axis, statistic, critical)
        # the test has the power to tell the draft's own distribution apart from the target's
        assert chi_square(counts.sum(axis), drafts.sum(axis))[0] > 10 * critical


def test_stats_without_a_draft_are_empty():
    engine = Engine(model_of("P"), slots=1, max_len=MAX_LEN)
    engine.submit(prompt(1, 4), max_new_tokens=2)
    assert engine.run()[0] == alone(engine.model, prompt(1, 4), 2)
    assert engine.speculation_stats() == SpeculationStats(0, 0, 0, 0, 0, 0.0, 1.0)


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(draft_tokens=0), ValueError, "draft_tokens must be an int >= 1, got 0"),
        (dict(draft_tokens=2.0), ValueError, "draft_tokens must be an int >= 1, got 2.0"),
        (dict(draft="model"), TypeError, "draft must be an LM or None, got str"),
        (dict(vocab=60), ValueError, r"draft must share the model's vocabulary: draft's vocab_size=60, the model's 61"),
        (dict(scanned=True), ValueError, "a draft needs a model with scan_layers=False"),
        (dict(state_format=8), ValueError, "state_format=8 with a draft is not supported"),
    ],
)
def test_a_bad_draft_is_refused_before_any_work(monkeypatch, options, error, message):
    options = dict(options)
    target = model_of("P", scan_layers=options.pop("scanned", False))
    draft = options.pop("draft", None) or model_of("P", seed=1, vocab_size=options.pop("vocab", BASE.vocab_size))
    made = []
    monkeypatch.setattr(LM, "init_caches", lambda *a, **k: made.append(a))
    with pytest.raises(error, match=message):
        Engine(target, slots=1, max_len=MAX_LEN, draft=draft, **options)
    assert not made


def test_a_request_the_draft_cannot_run_is_refused_before_any_work():
    target, draft = model_of("P"), model_of("A", seed=1)  # the draft's KV cache needs room the target's state does not
    engine = Engine(target, slots=1, max_len=16, draft=draft, draft_tokens=K)
    message = r"no room for the draft's max_new_tokens=10 and draft_tokens=3 \(a verify step's\): the caches hold 4"
    with pytest.raises(ValueError, match=message):
        engine.submit(prompt(1, 4), max_new_tokens=10)
    snapshot = prefill(target, prompt(1, 4), max_len=16)
    with pytest.raises(ValueError, match="draft_start must be the draft's one-row Snapshot"):
        engine.submit(snapshot, max_new_tokens=2)
    with pytest.raises(
        ValueError, match=r"draft_start must be a one-row snapshot of start's 4 tokens, got 1 rows of 5"
    ):
        engine.submit(snapshot, max_new_tokens=2, draft_start=prefill(draft, prompt(1, 5), max_len=16))
    with pytest.raises(ValueError, match="draft_start was prefilled by a model with other weights"):
        engine.submit(snapshot, max_new_tokens=2, draft_start=prefill(model_of("A", seed=2), prompt(1, 4), max_len=16))
    with pytest.raises(ValueError, match="draft_start is only for an engine with a draft and a Snapshot start"):
        engine.submit(prompt(1, 4), max_new_tokens=2, draft_start=prefill(draft, prompt(1, 4), max_len=16))
    assert engine.requests == [None] and engine.waiting == []
    r = engine.submit(snapshot, max_new_tokens=5, draft_start=prefill(draft, prompt(1, 4), max_len=16))
    assert engine.run()[r] == alone(target, prompt(1, 4), 5)  # a snapshot pair joins and continues
