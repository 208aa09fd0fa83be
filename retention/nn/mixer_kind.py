"""One layer letter's entry in the mixer registry (registry.py): how the LM builds the mixer from an LMConfig and
the formulas the sizing, the cache accounting and the comparison read. Each mixer module defines its kinds beside
its class; a formula takes the LMConfig (and lengths) and is exact for the module it describes (tests/nn check
each against the module's parameters and `cache_bytes` of its `init_cache`)."""

from collections.abc import Callable
from typing import NamedTuple


class MixerKind(NamedTuple):
    """One layer letter's entry in the mixer registry (`MIXERS`).

    Attributes:
        name: what the letter stands for.
        build: build(config, *, rngs) gives the mixer, a `Mixer` (mixer_interface.py; docs/DESIGN.md, "The
            mixer interface").
        params: params(config), its parameter count.
        matmul_params: matmul_params(config), the weights that multiply activations, per token.
        mixing_flops: mixing_flops(config, T), forward FLOPs per token of the sequence mixing and the short
            convolution at length T (the rest is 2 per matmul weight).
        cache_bytes: cache_bytes(config, batch, max_len, step_tokens), the bytes of its `init_cache(batch, max_len,
            config.dtype, step_tokens=...)`.
        fixed_state: whether that is the same at every max_len (a recurrent state, a window's ring buffer) or grows
            with it (a KV cache of max_len slots: a decode step needs room in it).
        step_bounded: whether a decode step may feed at most the cache's step_tokens tokens (a ring buffer of
            window + step_tokens - 1 slots) rather than any number.
        recipe: the LMConfig fields of its recipe (docs/DESIGN.md section 3, the recipe table: positional encoding,
            decay init), what a report names beside the model (experiments/compare/results.py).
    """

    name: str
    build: Callable
    params: Callable[..., int]
    matmul_params: Callable[..., int]
    mixing_flops: Callable[..., float]
    cache_bytes: Callable[..., int]
    fixed_state: bool
    step_bounded: bool
    recipe: tuple[str, ...]
