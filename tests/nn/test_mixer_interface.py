"""The mixer interface (retention/nn/mixer_interface.py), for every letter of the registry (a new mixer is tested
by its registry line alone): the `Mixer` protocol is satisfied with its keyword-only arguments; the full forward
equals a prefill of the whole sequence and a prefill of a prefix followed by decode steps of the rest, one token at
a time and in chunks of 3 (T odd, random inputs, a short convolution carried across the steps); a verify step's
rows are the decode steps', and its per-token caches roll back to the caches of decoding the kept tokens one at a
time (bit-exact at 0 kept); `init_cache`'s size is the same at every max_len exactly for the fixed-state mixers."""

import dataclasses
import inspect
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention.nn import MIXERS, LMConfig, cache_bytes
from retention.nn.mixer_interface import MODES, Mixer
from tests.helpers import rel_err
from tests.serve.test_rollback import _largest_difference_in_ulps

CONFIG = LMConfig(
    vocab_size=40, d_model=24, n_layers=1, pattern="P", n_heads=4, n_kv_heads=2, head_dim=6, window=4, conv_size=3
)
B, T, PREFIX, CHUNK = 2, 13, 5, 3
STEP_TOKENS = 4  # a W ring buffer's slack: decode chunks of 3 and a verify step of 4
LETTERS = sorted(MIXERS)


def _mixer(letter: str):
    config = dataclasses.replace(CONFIG, pattern=letter)
    return MIXERS[letter].build(config.for_kind(letter), rngs=nnx.Rngs(1))


def _inputs():
    x = jax.random.normal(jax.random.key(2), (B, T, CONFIG.d_model), jnp.float32)
    return x, jnp.arange(T, dtype=jnp.int32)


@nnx.jit
def _forward(mixer, x, positions):
    return mixer(x, positions=positions)


@partial(nnx.jit, static_argnames="mode")
def _run(mixer, x, positions, cache, mode: str):
    return getattr(mixer, mode)(x, positions=positions, cache=cache)


def _steps(mixer, x, positions, cache, n: int):
    """Decode steps of n tokens over x from cache: (the rows, the caches after each step)."""
    rows, caches = [], []
    for lo in range(0, x.shape[1], n):
        y, cache = _run(mixer, x[:, lo : lo + n], positions[lo : lo + n], cache, "decode")
        rows.append(y)
        caches.append(cache)
    return jnp.concatenate(rows, axis=1), caches


@pytest.mark.parametrize("letter", LETTERS)
def test_every_mixer_satisfies_the_protocol(letter):
    mixer = _mixer(letter)
    assert isinstance(mixer, Mixer)
    for mode in MODES:
        method = mixer.__call__ if mode == "forward" else getattr(mixer, mode)
        parameters = inspect.signature(method).parameters
        keywords = {n for n, p in parameters.items() if p.kind == inspect.Parameter.KEYWORD_ONLY}
        expected = {"positions", "segment_ids"} | ({"cache"} if mode != "forward" else set())
        assert keywords == expected, (mode, keywords)
        assert "trail" not in parameters
    assert list(inspect.signature(mixer.init_cache).parameters) == ["batch", "max_len", "dtype", "step_tokens"]
    assert list(inspect.signature(mixer.rollback).parameters)[:3] == ["before", "verified", "kept"]


@pytest.mark.parametrize("letter", LETTERS)
def test_forward_equals_prefill_and_decode_steps(letter):
    mixer, (x, positions) = _mixer(letter), _inputs()
    full = _forward(mixer, x, positions)
    assert full.shape == x.shape
    fresh = mixer.init_cache(B, T, x.dtype, step_tokens=STEP_TOKENS)
    whole, _ = _run(mixer, x, positions, fresh, "prefill")
    assert rel_err(whole, full) < 1e-5
    head, cache = _run(mixer, x[:, :PREFIX], positions[:PREFIX], fresh, "prefill")
    for n in (1, CHUNK):
        rest, _ = _steps(mixer, x[:, PREFIX:], positions[PREFIX:], cache, n)
        assert rel_err(jnp.concatenate([head, rest], axis=1), full) < 1e-5, n


@pytest.mark.parametrize("letter", LETTERS)
def test_verify_rolls_back_to_the_caches_of_decoding_token_by_token(letter):
    mixer, (x, positions) = _mixer(letter), _inputs()
    fresh = mixer.init_cache(B, T, x.dtype, step_tokens=STEP_TOKENS)
    _, before = _run(mixer, x[:, :PREFIX], positions[:PREFIX], fresh, "prefill")
    fed, fed_positions = x[:, PREFIX : PREFIX + STEP_TOKENS], positions[PREFIX : PREFIX + STEP_TOKENS]
    y, verified = _run(mixer, fed, fed_positions, before, "verify")
    at_once, _ = _run(mixer, fed, fed_positions, before, "decode")
    np.testing.assert_allclose(y, at_once, rtol=1e-5, atol=1e-5)
    rows, caches = _steps(mixer, fed, fed_positions, before, 1)
    np.testing.assert_allclose(y, rows, rtol=1e-5, atol=1e-5)
    rollback = nnx.jit(lambda m, b, v, kept: m.rollback(b, v, kept))
    assert _largest_difference_in_ulps(rollback(mixer, before, verified, jnp.int32(0)), before) == 0.0
    for kept, cache in enumerate(caches, start=1):
        got = rollback(mixer, before, verified, jnp.int32(kept))
        assert jax.tree.structure(got) == jax.tree.structure(cache)
        assert _largest_difference_in_ulps(got, cache) <= 4, kept


@pytest.mark.parametrize("letter", LETTERS)
def test_cache_grows_with_max_len_only_without_a_fixed_state(letter):
    mixer = _mixer(letter)
    size = lambda max_len: cache_bytes(jax.eval_shape(lambda: mixer.init_cache(B, max_len, jnp.float32)))
    assert (size(10) == size(10_000)) == MIXERS[letter].fixed_state
    if letter == "A":
        assert size(10_000) > size(10)
