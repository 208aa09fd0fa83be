"""Generation: greedy decoding equals feeding the argmax of the full forward back step by step; greedy needs no
key; with eos_id each row stops at its first eos (later positions eos, `lengths` where it stopped)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention import generate
from retention.nn import LM, LMConfig

CONFIG = LMConfig(
    vocab_size=50,
    d_model=32,
    n_layers=3,
    pattern="PWA",
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    window=4,
    chunk_size=16,
)


def greedy_by_full_forward(model, prompt, n_new):
    """Argmax fed back one token at a time, each from a full forward. The sequence is padded to its final length
    so one compile serves every step: logits at t depend only on tokens <= t (tests/nn/test_model.py)."""
    B, T0 = prompt.shape
    seq = jnp.concatenate([prompt, jnp.zeros((B, n_new), jnp.int32)], axis=1)
    forward = nnx.jit(lambda m, t: m(t))
    for t in range(T0, T0 + n_new):
        seq = seq.at[:, t].set(jnp.argmax(forward(model, seq)[:, t - 1], axis=-1).astype(jnp.int32))
    return seq


def stopped_at_eos(seq: np.ndarray, T0: int, eos: int) -> tuple[np.ndarray, np.ndarray]:
    """The oracle's rows cut at their first generated eos (eos after it), and each row's length up to it."""
    seq, lengths = seq.copy(), np.full(len(seq), seq.shape[1])
    for row in range(len(seq)):
        hits = np.flatnonzero(seq[row, T0:] == eos)
        if hits.size:
            lengths[row] = T0 + hits[0] + 1
            seq[row, lengths[row] :] = eos
    return seq, lengths


def test_greedy_generate_equals_full_forward_argmax():
    model = LM(CONFIG, rngs=nnx.Rngs(0))
    prompt = jax.random.randint(jax.random.key(1), (2, 7), 0, CONFIG.vocab_size, dtype=jnp.int32)
    out = generate(model, prompt, 11, temperature=0.0)  # greedy: no key needed
    assert out.tokens.shape == (2, 18) and out.tokens.dtype == jnp.int32
    assert bool(jnp.all(out.tokens == greedy_by_full_forward(model, prompt, 11)))
    assert out.lengths.tolist() == [18, 18]  # no eos_id: every row runs to the end
    # top_k=1 sampling at any temperature is greedy too
    sampled = generate(model, prompt, 11, temperature=0.7, top_k=1, key=jax.random.key(3))
    assert bool(jnp.all(sampled.tokens == out.tokens))


def test_eos_stops_each_row():
    """eos_id = a token row 0 emits mid-way: each row equals the oracle up to its first eos, then eos; a batch
    whose rows all stop ends early with the same result."""
    model = LM(CONFIG, rngs=nnx.Rngs(7))
    T0, N = 5, 12
    prompt = jax.random.randint(jax.random.key(8), (3, T0), 0, CONFIG.vocab_size, dtype=jnp.int32)
    oracle = np.asarray(greedy_by_full_forward(model, prompt, N))
    new = list(oracle[0, T0:])
    eos = next(int(t) for i, t in enumerate(new) if i >= 2 and t not in new[:i])  # first seen at position >= 2
    want, lengths = stopped_at_eos(oracle, T0, eos)
    out = generate(model, prompt, N, temperature=0.0, eos_id=eos)
    np.testing.assert_array_equal(np.asarray(out.tokens), want)
    np.testing.assert_array_equal(np.asarray(out.lengths), lengths)
    assert lengths[0] < T0 + N
    alone = generate(model, prompt[:1], N, temperature=0.0, eos_id=eos)  # every row stops: the loop ends early
    np.testing.assert_array_equal(np.asarray(alone.tokens), want[:1])
    assert int(alone.lengths[0]) == lengths[0]


def test_sampling_is_reproducible_and_in_vocab():
    model = LM(dataclasses.replace(CONFIG, pattern="P", n_layers=2), rngs=nnx.Rngs(4))
    prompt = jax.random.randint(jax.random.key(5), (3, 5), 0, CONFIG.vocab_size, dtype=jnp.int32)
    a = generate(model, prompt, 9, temperature=1.0, top_k=10, key=jax.random.key(6)).tokens
    b = generate(model, prompt, 9, temperature=1.0, top_k=10, key=jax.random.key(6)).tokens
    assert bool(jnp.all(a == b)) and bool(jnp.all(a[:, :5] == prompt))
    assert bool(jnp.all((a >= 0) & (a < CONFIG.vocab_size)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": 0.5}, "key must be a jax.random key to sample with temperature > 0"),
        ({"temperature": 0.0, "eos_id": 50}, r"eos_id must be None or an int in \[0, vocab_size=50\), got 50"),
        ({"temperature": 0.0, "eos_id": -1}, r"eos_id must be None or an int in \[0, vocab_size=50\), got -1"),
        ({"temperature": float("nan")}, r"temperature must be a finite number in \[0.0, inf\), got nan"),
        ({"temperature": float("inf")}, r"temperature must be a finite number in \[0.0, inf\), got inf"),
        ({"temperature": -0.5}, r"temperature must be a finite number in \[0.0, inf\), got -0.5"),
        ({"temperature": "1"}, r"temperature must be a finite number in \[0.0, inf\), got '1'"),
        ({"temperature": 0.0, "top_k": 0}, "top_k must be an int >= 1, got 0"),
        ({"temperature": 0.0, "top_k": 2.5}, "top_k must be an int >= 1, got 2.5"),
        ({"temperature": 0.0, "top_k": True}, "top_k must be an int >= 1, got True"),
        ({"temperature": 0.0, "top_k": 51}, "top_k must be <= vocab_size=50, got 51"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    model = nnx.eval_shape(lambda: LM(CONFIG, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=message):
        generate(model, jnp.zeros((1, 3), jnp.int32), 4, **kwargs)


@pytest.mark.slow  # a further case: ragged prompts through P and A with a convolution below are quick
def test_ragged_prompts_generate_as_each_prompt_alone():
    """Left-padded prompts of lengths 7, 2 and 5 in one batch (the padding random ids, never seen): each row's
    greedy continuation equals that prompt generated alone (P, W and A layers; RoPE from each prompt's start)."""
    model = LM(CONFIG, rngs=nnx.Rngs(7))
    prompt = jax.random.randint(jax.random.key(8), (3, 7), 0, CONFIG.vocab_size, dtype=jnp.int32)
    lengths = jnp.asarray([7, 2, 5], jnp.int32)
    out = generate(model, prompt, 6, prompt_lengths=lengths, temperature=0.0, key=jax.random.key(9))
    out = out.tokens
    assert bool(jnp.all(out[:, :7] == prompt))
    for b, n in enumerate(lengths.tolist()):
        alone = generate(model, prompt[b : b + 1, 7 - n :], 6, temperature=0.0, key=jax.random.key(9)).tokens
        assert bool(jnp.all(out[b, 7:] == alone[0, n:])), b


@pytest.mark.parametrize("bad", [999, -5])
def test_prompt_ids_outside_the_vocabulary_are_refused(bad):
    """Id 999 with vocab 50 gave zeros and -5 wrapped to another token; now ValueError (on the padding: ignored)."""
    model = LM(CONFIG, rngs=nnx.Rngs(0))
    prompt = jnp.asarray([[1, 2, bad, 3]], jnp.int32)
    with pytest.raises(ValueError, match=rf"prompt ids must be in \[0, vocab_size=50\), got \[{bad}\]"):
        generate(model, prompt, 2, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"prompt_lengths must be in \[1, T0=4\], got \[0\]"):
        generate(model, prompt, 2, prompt_lengths=jnp.asarray([0]), key=jax.random.key(0))
    padded = generate(model, prompt, 2, prompt_lengths=jnp.asarray([1]), temperature=0.0, key=jax.random.key(0))
    assert padded.tokens.shape == (1, 6)


@pytest.mark.parametrize("pattern", [*(pytest.param(p, marks=pytest.mark.slow) for p in ("P", "A", "PW", "W")), "PA"])
def test_ragged_prompts_shorter_than_the_convolution_generate_as_alone(pattern):
    """conv_size 4: prompt_lengths [1, 5, 9, 13] in one batch, left-padded (row 0: 1 token, fewer than
    conv_size - 1): each row's greedy tokens equal its prompt generated alone, token for token (the padding never
    reaches a prompt through the convolution's cache)."""
    config = dataclasses.replace(CONFIG, pattern=pattern, n_layers=max(2, len(pattern)), conv_size=4)
    model = LM(config, rngs=nnx.Rngs(21))
    prompt = jax.random.randint(jax.random.key(22), (4, 13), 0, CONFIG.vocab_size, dtype=jnp.int32)
    lengths = [1, 5, 9, 13]
    out = generate(model, prompt, 6, prompt_lengths=jnp.asarray(lengths, jnp.int32), temperature=0.0).tokens
    for b, n in enumerate(lengths):
        alone = generate(model, prompt[b : b + 1, 13 - n :], 6, temperature=0.0).tokens
        assert out[b, 13:].tolist() == alone[0, n:].tolist(), (pattern, lengths, b)
