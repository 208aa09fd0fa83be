"""The caches' limits come from the mixer registry, not from layer letters: a mixer registered under a new letter
whose cache grows with the length (a copy of full attention's entry) gets the room check on every path that feeds
tokens into a snapshot or slot (generate's start, extend, the slot engine, verify), and one whose cache bounds a
decode step (a copy of the sliding window's) has extend feed it in steps of step_tokens, equal to the full
forward."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention import generate, prefill
from retention.nn import LM, LMConfig
from retention.nn.registry import MIXERS
from retention.serve import Engine, extend, verify
from retention.serve.cache_limits import growing_layers, step_size

pytestmark = pytest.mark.integration  # the serving layer (retention.serve, snapshots): make test-integration

BASE = LMConfig(vocab_size=61, d_model=32, n_layers=2, pattern="P", n_heads=4, n_kv_heads=2, head_dim=8, window=3)


@pytest.fixture
def new_letters(monkeypatch):
    """X: a mixer whose cache grows with the length; Y: one whose cache bounds a decode step (new letters)."""
    monkeypatch.setitem(MIXERS, "X", MIXERS["A"]._replace(name="a growing cache"))
    monkeypatch.setitem(MIXERS, "Y", MIXERS["W"]._replace(name="a ring buffer"))


def tokens(seed: int, T: int) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (1, T), 0, BASE.vocab_size, dtype=jnp.int32)


def test_the_registry_says_which_layers_need_room_and_bound_a_step(new_letters):
    assert growing_layers(dataclasses.replace(BASE, pattern="PX", n_layers=4)) == "X"
    assert growing_layers(dataclasses.replace(BASE, pattern="PAWA", n_layers=4)) == "A"
    assert growing_layers(dataclasses.replace(BASE, pattern="PDGMW", n_layers=5)) == ""
    assert step_size(dataclasses.replace(BASE, pattern="PY"), 2, 5) == 2
    assert step_size(dataclasses.replace(BASE, pattern="PX"), 2, 5) == 5


def test_a_new_mixer_with_a_growing_cache_gets_the_room_check(new_letters):
    model = LM(dataclasses.replace(BASE, pattern="PX"), rngs=nnx.Rngs(0))
    snapshot = prefill(model, tokens(1, 6), max_len=10, step_tokens=3)
    room = r"no room for {}: the caches hold {} tokens of max_len=10, and the X layers' caches keep every token"
    with pytest.raises(ValueError, match=room.format("max_new_tokens=5", 6)):
        generate(model, tokens(2, 0), 5, temperature=0.0, start=snapshot)
    with pytest.raises(ValueError, match=room.format("5 more tokens", 6)):
        extend(model, snapshot, tokens(2, 5))
    with pytest.raises(ValueError, match=room.format(r"k \+ 1 = 3 tokens", 8)):
        verify(model, extend(model, snapshot, tokens(2, 2)), tokens(3, 3))
    engine = Engine(model, slots=1, max_len=10, step_tokens=3)
    with pytest.raises(ValueError, match=room.format("max_new_tokens=5", 6)):
        engine.submit(snapshot, max_new_tokens=5)
    generate(model, tokens(2, 0), 4, temperature=0.0, start=snapshot)  # what fits runs


def test_a_new_mixer_that_bounds_a_step_is_fed_in_pieces(new_letters):
    model = LM(dataclasses.replace(BASE, pattern="PY"), rngs=nnx.Rngs(0))
    prompt = tokens(4, 9)
    snapshot = extend(model, prefill(model, prompt[:, :2], max_len=9, step_tokens=2), prompt[:, 2:])  # 7 in pieces
    np.testing.assert_allclose(snapshot.logits, model(prompt)[:, -1], atol=2e-5, rtol=2e-5)
