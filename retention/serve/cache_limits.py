"""What an LM's caches allow a continuation, read from the mixer registry (retention/nn/registry.py), never from
layer letters: a layer whose cache grows with the length (`MixerKind.fixed_state` False: a KV cache of max_len
slots) needs room for every token fed, and a layer whose cache bounds a decode step (`MixerKind.step_bounded`: a
window's ring buffer) takes at most step_tokens tokens a step."""

from retention.nn import LMConfig
from retention.nn.registry import MIXERS


def growing_layers(config: LMConfig) -> str:
    """The letters (each once, in pattern order) of the config's layers whose caches grow with the length.

    Args:
        config: the LM's config.

    Returns:
        The letters, "" when every cache is the same at every length.
    """
    return "".join(k for k in dict.fromkeys(config.layer_kinds) if not MIXERS[k].fixed_state)


def check_room(config: LMConfig, held: int | None, new: int, max_len: int, what: str) -> None:
    """Refuse feeding `new` more tokens into caches made for max_len tokens that hold `held` already, when a layer's
    cache grows with the length (a fixed-size cache has room for any number).

    Args:
        config: the LM's config.
        held: the tokens the caches hold (None: unknown, traced; nothing is checked).
        new: the tokens to feed.
        max_len: the caches' max_len.
        what: the new tokens as the caller's argument names them, for the message (e.g. "max_new_tokens=30").

    Raises:
        ValueError: naming `what`, the tokens held, max_len and the growing layers.
    """
    growing = growing_layers(config)
    if growing and held is not None and held + new > max_len:
        raise ValueError(
            f"no room for {what}: the caches hold {held} tokens of max_len={max_len}, and the {growing} layers' "
            "caches keep every token (prefill with a larger max_len)"
        )


def step_size(config: LMConfig, step_tokens: int, n: int) -> int:
    """The most tokens of n to feed in one decode step.

    Args:
        config: the LM's config.
        step_tokens: the step size the caches were made for.
        n: the tokens to feed.

    Returns:
        step_tokens when a layer's cache bounds a decode step (a ring buffer), else n (one step).
    """
    return step_tokens if any(MIXERS[k].step_bounded for k in set(config.layer_kinds)) else n
