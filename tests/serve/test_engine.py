"""The slot engine: requests joining and leaving at different steps (by length and by eos, from prompts of
different lengths and from a snapshot) each get the tokens of their run alone (greedy `generate`), for P, A, W and
a hybrid; a snapshot of several rows or without room, an eos_id outside the vocabulary (as generate refuses it)
and an empty prompt are refused, naming them. The queue and snapshots of other shapes: test_engine_queue.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention import generate, prefill
from retention.nn import LM, LMConfig
from retention.serve.engine import Engine

pytestmark = pytest.mark.integration  # the serving layer (retention.serve, snapshots): make test-integration

BASE = LMConfig(vocab_size=61, d_model=32, n_layers=2, pattern="P", n_heads=4, n_kv_heads=2, head_dim=8, window=5)
MAX_LEN, N = 32, 8


def prompt(seed: int, T: int) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (1, T), 0, BASE.vocab_size, dtype=jnp.int32)


@pytest.mark.parametrize("pattern", [*(pytest.param(p, marks=pytest.mark.slow) for p in ("P", "A", "W")), "PA"])
def test_requests_joining_and_leaving_each_equal_their_run_alone(pattern):
    config = dataclasses.replace(BASE, pattern=pattern, conv_size=4 if pattern == "PA" else 0)
    model = LM(config, rngs=nnx.Rngs(0))
    prompts = [prompt(1, 7), prompt(2, 12), prompt(3, 7), prompt(4, 12)]
    alone = [np.asarray(generate(model, p, N, temperature=0.0).tokens[0, p.shape[1] :]) for p in prompts]
    eos = int(alone[1][3])  # request 1 stops at its first generated `eos` (at or before its 4th token)
    stop = int(np.flatnonzero(alone[1] == eos)[0]) + 1
    engine = Engine(model, slots=2, max_len=MAX_LEN)
    r0 = engine.submit(prompts[0], max_new_tokens=5)
    engine.step()
    r1 = engine.submit(prompts[1][0], max_new_tokens=N, eos_id=eos)
    while engine.requests[0] is not None:  # r0 leaves after 5 tokens
        engine.step()
    r2 = engine.submit(prefill(model, prompts[2], max_len=MAX_LEN), max_new_tokens=N)  # joins from a snapshot
    engine.step()
    if engine.requests[1] is None:  # r1 has left at its eos: r3 joins in its slot
        r3 = engine.submit(prompts[3], max_new_tokens=3)
    else:
        engine.run()
        r3 = engine.submit(prompts[3], max_new_tokens=3)
    finished = engine.run()
    assert finished[r0] == alone[0][:5].tolist()
    assert finished[r1] == alone[1][:stop].tolist()
    assert finished[r2] == alone[2].tolist()
    assert finished[r3] == alone[3][:3].tolist()


def test_a_snapshot_of_several_rows_or_without_room_is_refused():
    model = LM(dataclasses.replace(BASE, pattern="PA"), rngs=nnx.Rngs(0))
    engine = Engine(model, slots=2, max_len=MAX_LEN)
    with pytest.raises(ValueError, match="one-row snapshot, got 2 rows"):
        engine.submit(prefill(model, jnp.concatenate([prompt(5, 4)] * 2), max_len=MAX_LEN), max_new_tokens=2)
    with pytest.raises(ValueError, match="no room for max_new_tokens=40: the caches hold 4 tokens of max_len=32"):
        engine.submit(prompt(5, 4), max_new_tokens=40)


def test_an_eos_id_past_the_vocabulary_or_an_empty_prompt_is_refused():
    model = LM(BASE, rngs=nnx.Rngs(0))
    engine = Engine(model, slots=1, max_len=MAX_LEN)
    for eos_id in (1000, BASE.vocab_size, -1):  # as generate refuses it
        message = rf"eos_id must be None or an int in \[0, vocab_size=61\), got {eos_id}"
        with pytest.raises(ValueError, match=message):
            engine.submit(prompt(6, 4), max_new_tokens=2, eos_id=eos_id)
        with pytest.raises(ValueError, match=message):
            generate(model, prompt(6, 4), 2, temperature=0.0, eos_id=eos_id)
    for empty in (jnp.zeros((0,), jnp.int32), jnp.zeros((1, 0), jnp.int32)):
        with pytest.raises(ValueError, match=r"start is an empty prompt \(shape \(1, 0\)\): a prompt needs at least"):
            engine.submit(empty, max_new_tokens=2)
    assert engine.requests == [None]  # nothing refused took the slot
