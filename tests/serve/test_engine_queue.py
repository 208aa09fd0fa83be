"""The engine's queue and its snapshots of other shapes, against `generate` run alone: 6 requests submitted at once
to 2 slots (mixed prompt lengths and max_new_tokens, greedy) wait, join first come first served, stream their tokens
and each get the tokens of its run alone, for P and a hybrid with an A layer; snapshots prefilled with a smaller and a
larger max_len and another step_tokens join and continue to the tokens of their run alone, for every layer kind (A and
W KV caches, float and quantized, stacked by scan_layers; P, D, G and M states); every bad submit is refused before
any work, naming the argument, its value and what is allowed, while requests wait."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention import generate, prefill
from retention.nn import LM, LMConfig
from retention.serve import engine as engine_module
from retention.serve import resize
from retention.serve.engine import Engine

pytestmark = pytest.mark.integration  # the serving layer (retention.serve, snapshots): make test-integration

BASE = LMConfig(
    vocab_size=61, d_model=32, n_layers=2, pattern="P", n_heads=4, n_kv_heads=2, head_dim=8, window=5,
    ssm_state_size=4,
)  # fmt: skip
MAX_LEN = 32


def prompt(seed: int, T: int) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (1, T), 0, BASE.vocab_size, dtype=jnp.int32)


def alone(model: LM, prompt_1T, n: int) -> list[int]:
    """The request's greedy tokens, run alone by `generate` (the oracle)."""
    return np.asarray(generate(model, prompt_1T, n, temperature=0.0).tokens[0, prompt_1T.shape[1] :]).tolist()


@pytest.mark.parametrize("pattern", ["P", "PA"])
def test_six_requests_for_two_slots_queue_and_each_equal_their_run_alone(pattern):
    model = LM(dataclasses.replace(BASE, pattern=pattern, conv_size=4 if pattern == "PA" else 0), rngs=nnx.Rngs(0))
    lengths, news = (3, 9, 5, 12, 4, 7), (6, 2, 5, 3, 7, 4)
    prompts = [prompt(10 + i, T) for i, T in enumerate(lengths)]
    engine = Engine(model, slots=2, max_len=MAX_LEN)
    ids = [engine.submit(p, max_new_tokens=n) for p, n in zip(prompts, news)]
    assert ids == list(range(6))
    assert [r.id for r in engine.requests] == [0, 1] and engine.waiting == [2, 3, 4, 5]
    streamed: dict[int, list[int]] = {}
    for request_id, token in engine.stream():
        assert len([r for r in engine.requests if r is not None]) <= 2
        streamed.setdefault(request_id, []).append(token)
    assert list(streamed) == ids  # first tokens in the order submitted: first come, first served
    assert engine.waiting == [] and engine.requests == [None, None]
    expected = {i: alone(model, p, n) for i, (p, n) in enumerate(zip(prompts, news))}
    assert streamed == expected
    assert engine.finished == expected
    assert engine.run() == expected  # nothing left to run


CASES = {
    # every layer kind: KV caches of full attention (A) and a window's ring buffer (W), and the fixed states
    "PAWDGM": dict(pattern="PAWDGM", n_layers=6, conv_size=3),
    # quantized KV caches, stacked over the repeats of the period (scan_layers)
    "PAW int8 scanned": dict(pattern="PAW", n_layers=6, kv_cache_bits=8, scan_layers=True),
}


@pytest.mark.parametrize("case", CASES)
def test_snapshots_of_other_max_len_and_step_tokens_join_and_equal_their_run_alone(case):
    model = LM(dataclasses.replace(BASE, **CASES[case]), rngs=nnx.Rngs(0))
    engine = Engine(model, slots=2, max_len=MAX_LEN, step_tokens=2)
    small, large, plain = prompt(20, 9), prompt(21, 7), prompt(22, 5)
    a = engine.submit(prefill(model, small, max_len=12, step_tokens=3), max_new_tokens=8)  # fewer KV slots, more ring
    b = engine.submit(prefill(model, large, max_len=64), max_new_tokens=6)  # more KV slots, a smaller ring
    c = engine.submit(plain, max_new_tokens=5)  # waits for a slot
    assert engine.waiting == [c]
    finished = engine.run()
    assert finished[a] == alone(model, small, 8)
    assert finished[b] == alone(model, large, 6)
    assert finished[c] == alone(model, plain, 5)


def test_every_bad_submit_is_refused_before_any_work(monkeypatch):
    model = LM(dataclasses.replace(BASE, pattern="PA"), rngs=nnx.Rngs(0))
    engine = Engine(model, slots=1, max_len=MAX_LEN)
    first = engine.submit(prompt(30, 4), max_new_tokens=3)
    queued = engine.submit(prompt(31, 4), max_new_tokens=3)  # the slot is taken: it waits
    other_weights = LM(model.config, rngs=nnx.Rngs(1))
    other_config = LM(dataclasses.replace(model.config, d_model=16), rngs=nnx.Rngs(0))
    prefills = []
    monkeypatch.setattr(engine_module, "prefill", lambda *a, **k: prefills.append(a))
    monkeypatch.setattr(engine_module, "resize", lambda *a, **k: prefills.append(a))
    ok = dict(max_new_tokens=3)
    bad = [
        (prompt(32, 4).at[0, 1].set(61), ok, r"prompt ids must be in \[0, vocab_size=61\), got \[61\]"),
        (prompt(32, 4).at[0, 2].set(-3), ok, r"prompt ids must be in \[0, vocab_size=61\), got \[-3\]"),
        (prompt(32, 40), ok, "start is a prompt of 40 tokens, more than this engine's max_len=32"),
        (
            prompt(32, 20),
            dict(max_new_tokens=13),
            "no room for max_new_tokens=13: the caches hold 20 tokens of max_len=32",
        ),
        (jnp.zeros((2, 4), jnp.int32), ok, r"a prompt must be an int array \[T\] or \[1, T\], got shape \(2, 4\)"),
        (jnp.zeros((1, 4)), ok, r"start must be an int array \[B, T\], got \(1, 4\)"),
        (jnp.zeros((0,), jnp.int32), ok, r"start is an empty prompt \(shape \(1, 0\)\)"),
        (prompt(32, 4), dict(max_new_tokens=0), "max_new_tokens must be an int >= 1, got 0"),
        (prompt(32, 4), dict(max_new_tokens=2.0), "max_new_tokens must be an int >= 1, got 2.0"),
        (prompt(32, 4), dict(ok, temperature=-1.0), r"temperature must be a finite number in \[0.0, inf\), got -1.0"),
        (prompt(32, 4), dict(ok, temperature=float("nan")), "temperature must be a finite number"),
        (prompt(32, 4), dict(ok, temperature=0.5), "key must be a jax.random key to sample with temperature > 0"),
        (prompt(32, 4), dict(ok, top_k=0), "top_k must be an int >= 1, got 0"),
        (prompt(32, 4), dict(ok, top_k=62), "top_k must be <= vocab_size=61, got 62"),
        (prompt(32, 4), dict(ok, eos_id=61), r"eos_id must be None or an int in \[0, vocab_size=61\), got 61"),
        (prefill(model, prompt(32, 20), max_len=40), dict(max_new_tokens=13), "no room for max_new_tokens=13"),
        (prefill(model, jnp.concatenate([prompt(32, 4)] * 2), max_len=16), ok, "one-row snapshot, got 2 rows"),
        (prefill(other_weights, prompt(32, 4), max_len=16), ok, "start was prefilled by a model with other weights"),
        (prefill(other_config, prompt(32, 4), max_len=16), ok, "start comes from another model config: d_model=16"),
    ]
    for start, options, message in bad:
        with pytest.raises(ValueError, match=message):
            engine.submit(start, **options)
        assert engine.waiting == [queued] and [r.id for r in engine.requests] == [first] and not prefills


def test_resize_keeps_a_snapshot_of_its_shapes_and_refuses_one_longer_than_max_len():
    model = LM(dataclasses.replace(BASE, pattern="PA"), rngs=nnx.Rngs(0))
    snapshot = prefill(model, prompt(40, 10), max_len=16)
    assert resize(model, snapshot, max_len=16) is snapshot
    message = "snapshot holds 10 tokens, more than max_len=8, and the A layers' caches keep every token"
    with pytest.raises(ValueError, match=message):
        resize(model, snapshot, max_len=8)
    assert resize(model, snapshot, max_len=10).caches.layers[1].kv.k.shape[2] == 10  # room for the 10 exactly
