"""Sampling settings and the sampler that `generate` and the slot engine share: argmax at temperature 0, else a draw
from softmax(logits / temperature) over the top_k most likely tokens (`sampling_probabilities`: that distribution,
which speculative sampling reads)."""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from retention.validation import check_int, check_number


def check_sampling(vocab_size: int, *, temperature, top_k, key, eos_id) -> None:
    """Refuse sampling settings a model of vocab_size tokens cannot use.

    Args:
        vocab_size: the model's vocabulary size.
        temperature: a finite number >= 0 (0: greedy).
        top_k: None (every token) or an int in [1, vocab_size].
        key: a jax.random key; may be None when greedy.
        eos_id: None (no stop token) or an int id in [0, vocab_size).

    Raises:
        ValueError: naming the argument, its value and what is allowed.
    """
    check_number("temperature", temperature, low=0.0)  # 0 = greedy; NaN and inf are refused
    if top_k is not None:
        check_int("top_k", top_k)
        if top_k > vocab_size:
            raise ValueError(f"top_k must be <= vocab_size={vocab_size}, got {top_k}")
    if eos_id is not None:
        is_int = isinstance(eos_id, (int, np.integer)) and not isinstance(eos_id, bool)
        if not is_int or not 0 <= eos_id < vocab_size:
            raise ValueError(f"eos_id must be None or an int in [0, vocab_size={vocab_size}), got {eos_id!r}")
    if key is None and temperature > 0:
        raise ValueError("key must be a jax.random key to sample with temperature > 0 (temperature=0 is greedy)")


def sample(logits: Float[Array, "*b V"], key, temperature, top_k) -> Int[Array, "*b"]:
    """One token per row of logits (settings checked by `check_sampling`).

    Args:
        logits: [..., V] float.
        key: the jax.random key of this draw (one for all rows).
        temperature: 0 (a Python number: argmax only, nothing drawn), or a float or float array [...] per row:
            argmax where it is 0, else a draw from softmax(logits / temperature).
        top_k: None (every token), a Python int (the same k for every row) or an int array [...] per row in
            [1, V]: the draw is over the top_k largest logits.

    Returns:
        int32 [...]: the tokens.
    """
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if isinstance(temperature, (int, float)) and temperature == 0:
        return greedy
    temperature = jnp.asarray(temperature, jnp.float32)
    drawn = jax.random.categorical(key, sampling_logits(logits, temperature, top_k), axis=-1)
    return jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)


def sampling_logits(logits: Float[Array, "*b V"], temperature, top_k) -> Float[Array, "*b V"]:
    """The logits `sample` draws from at temperature > 0: those outside the top_k set to -inf, all divided by the
    temperature (by 1 where it is 0).

    Args:
        logits: [..., V] float.
        temperature: a float or float array [...] per row.
        top_k: None, a Python int or an int array [...] per row in [1, V].

    Returns:
        [..., V]: softmax of these is the distribution `sample` draws from.
    """
    if isinstance(top_k, int):
        kth_best = jax.lax.top_k(logits, top_k)[0][..., -1:]
    elif top_k is not None:
        position = logits.shape[-1] - jnp.asarray(top_k)[..., None]  # the k-th largest, in ascending order
        kth_best = jnp.take_along_axis(jnp.sort(logits, axis=-1), position, axis=-1)
    if top_k is not None:
        logits = jnp.where(logits < kth_best, -jnp.inf, logits)
    temperature = jnp.asarray(temperature, jnp.float32)
    return logits / jnp.where(temperature > 0, temperature, 1.0)[..., None]


def sampling_probabilities(logits: Float[Array, "*b V"], temperature, top_k) -> Float[Array, "*b V"]:
    """The distribution `sample` draws each row's token from: softmax(`sampling_logits`) at temperature > 0, the
    one-hot of the argmax at 0.

    Args:
        logits: [..., V] float.
        temperature: a float or float array [...] per row.
        top_k: None, a Python int or an int array [...] per row in [1, V].

    Returns:
        float32 [..., V], each row summing to 1.
    """
    temperature = jnp.asarray(temperature, jnp.float32)
    drawn = jax.nn.softmax(sampling_logits(logits, temperature, top_k).astype(jnp.float32), axis=-1)
    greedy = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    return jnp.where((temperature > 0)[..., None], drawn, greedy)
