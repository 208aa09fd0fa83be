"""Prompts as `generate`, `prefill` and the slot engine take them: an int array [B, T], ragged rows left-padded.

A ragged batch is one document per row after its padding: the padding is a document of its own (segment id 0, the
prompt 1), so every row sees only its prompt, from RoPE position 0, as if it ran alone."""

import jax.numpy as jnp
from jaxtyping import Array, Int

from retention.validation import concrete


def check_prompt(name: str, tokens_BT, *, empty: bool = False) -> None:
    """Refuse a prompt that is not an int array [B, T] with T >= 1.

    Args:
        name: the argument's name, for the message.
        tokens_BT: the prompt.
        empty: allow T = 0 too (a suffix run into a snapshot may be empty).

    Raises:
        ValueError: naming `name` and the shape, when tokens_BT is not a 2-D int array or is empty (unless `empty`).
    """
    if getattr(tokens_BT, "ndim", None) != 2 or not jnp.issubdtype(tokens_BT.dtype, jnp.integer):
        raise ValueError(f"{name} must be an int array [B, T], got {getattr(tokens_BT, 'shape', tokens_BT)}")
    if tokens_BT.shape[1] == 0 and not empty:
        shape = tuple(tokens_BT.shape)
        raise ValueError(f"{name} is an empty prompt (shape {shape}): a prompt needs at least one token")


def prompt_segments(prompt_lengths, B: int, T0: int) -> Int[Array, "B T0"]:
    """The segment ids of left-padded prompts.

    Args:
        prompt_lengths: int array [B], each in [1, T0] (checked when its values are known): row b's prompt is its
            last prompt_lengths[b] tokens.
        B: the prompt's rows.
        T0: the prompt's length, padding included.

    Returns:
        int32 [B, T0]: 0 on each row's padding, 1 on its prompt.

    Raises:
        ValueError: naming prompt_lengths, when it is not an int array [B] or a length is outside [1, T0].
    """
    if getattr(prompt_lengths, "shape", None) != (B,) or not jnp.issubdtype(prompt_lengths.dtype, jnp.integer):
        raise ValueError(
            f"prompt_lengths must be an int array [B] = [{B}], got {getattr(prompt_lengths, 'shape', None)}"
        )
    lengths = concrete(prompt_lengths)
    if lengths is not None and (lengths.min() < 1 or lengths.max() > T0):
        raise ValueError(f"prompt_lengths must be in [1, T0={T0}], got {lengths.tolist()}")
    return (jnp.arange(T0) >= T0 - jnp.asarray(prompt_lengths)[:, None]).astype(jnp.int32)


def check_prompt_ids(prompt_BT, segment_ids, vocab_size: int) -> None:
    """Refuse prompt ids (not the padding's) outside [0, vocab_size), when their values are known (not traced).

    Args:
        prompt_BT: int array [B, T].
        segment_ids: None (every token is the prompt's) or `prompt_segments`' [B, T] (1 on the prompt).
        vocab_size: the model's vocabulary size.

    Raises:
        ValueError: naming the prompt ids, vocab_size and up to 8 of the ids outside it.
    """
    values = concrete(prompt_BT)
    real = None if segment_ids is None else concrete(segment_ids)
    if values is None or (segment_ids is not None and real is None):
        return
    ids = values if real is None else values[real == 1]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)]
        raise ValueError(f"prompt ids must be in [0, vocab_size={vocab_size}), got {bad[:8].tolist()}")
