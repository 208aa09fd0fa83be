"""The interface every sequence mixer implements (`Mixer`): its four modes as four methods, its cache's
constructor and the rollback of a verify step. The Block (model.py) calls the method of the mode it runs
(`MODES`); tests/nn/test_mixer_interface.py runs every mixer of the registry through the contracts below.

Shapes: x [B, T, d_model] is the normalised residual stream; positions are RoPE's, [T] or [B, T] (a mixer without
RoPE takes None; one with RoPE refuses None by name); segment_ids int [B, T] or None (packed documents: no token
sees another document's). A cache is the mixer's own pytree (`init_cache`); its size is fixed by
(batch, max_len, step_tokens) and never changes across steps, so a decode step compiles once per shape.
"""

from typing import Any, Protocol, runtime_checkable

MODES = ("forward", "prefill", "decode", "verify")
"""The modes a Block runs its mixer in: the method of each ("forward" is `__call__`)."""


def check_mode(mode) -> str:
    """`mode` must be one of MODES (ValueError naming them otherwise); returns it."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


@runtime_checkable
class Mixer(Protocol):
    """A sequence mixer: what a new layer letter's module implements (docs/DESIGN.md, "The mixer interface").

    The contracts (float32; equal to the float32 rounding of the ops, which sum the same terms in other orders):
    - `__call__(x)` equals `prefill(x, cache=init_cache(...))[0]`, and equals a prefill of a prefix followed by
      decode steps of the rest (one token at a time, or in chunks of up to step_tokens), row for row.
    - `prefill(x)` then `decode(x2)` leaves the cache of `prefill` of x and x2 together.
    - `verify(x2, cache=c)` returns the rows of `decode(x2, cache=c)` and what `rollback(c, ·, kept)` turns into the
      cache a decode of the first `kept` tokens of x2 leaves, for every kept in 0..T (0 gives `c` itself, bit for
      bit).
    """

    def __call__(self, x_BTD, *, positions=None, segment_ids=None) -> Any:
        """The full causal forward of T tokens from an empty state, no cache: y [B, T, d_model]."""

    def prefill(self, x_BTD, *, positions=None, segment_ids=None, cache) -> tuple[Any, Any]:
        """A prompt of T tokens (stream positions 0..T-1) into the empty `cache` of `init_cache` (for A, one with
        max_len >= T): (y [B, T, d_model] equal to `__call__`'s, the filled cache)."""

    def decode(self, x_BTD, *, positions=None, segment_ids=None, cache) -> tuple[Any, Any]:
        """T >= 1 tokens continuing the sequence `cache` holds (T <= step_tokens for a step-bounded mixer, the
        registry's `step_bounded`; room for T more for A): (y [B, T, d_model], the cache after them). segment_ids
        None continues each row's document; a first id other than the row's last starts a new one."""

    def verify(self, x_BTD, *, positions=None, segment_ids=None, cache) -> tuple[Any, Any]:
        """A decode step of T tokens that keeps what a rollback needs: (y [B, T, d_model] as `decode`'s, the
        per-token caches): for the fixed states every cache field stacked [T, ...] (entry i the cache after tokens
        0..i), for attention the keys and values after all T with the conv caches per token. Only `rollback`
        reads them."""

    def rollback(self, before, verified, kept) -> Any:
        """The cache after the first `kept` (0..T, an int or a traced int32 scalar) tokens of
        `verify(x, cache=before)`, given what it returned beside y: equal to that of `decode` of those tokens."""

    def init_cache(self, batch: int, max_len: int, dtype=None, *, step_tokens: int = 1) -> Any:
        """An empty cache for `batch` rows of up to max_len tokens in all, decoded in steps of up to step_tokens
        tokens. Its size is the registry's `cache_bytes`: the same at every max_len for a fixed-state mixer (the
        registry's `fixed_state`), max_len slots of keys and values for full attention."""
