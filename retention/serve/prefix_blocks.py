"""Prefix-cache entries that share a growing cache by blocks, as paged KV caches do (vLLM's automatic prefix caching,
SGLang's radix tree): the entry at a block boundary holds, for every layer whose cache grows with the length (an A
layer's keys and values: `MixerKind.fixed_state` False), only the slots its block added since its parent entry,
and every other cache whole (a fixed-size state, a window's ring buffer, the convolutions' inputs: the same bytes
at every length) with the last token's logits. So caching a prompt of n tokens keeps O(n) bytes of keys and
values, not one copy of its prefix per block.

`block_entry` makes an entry from the snapshot at a boundary; `assemble` gives back the snapshot a chain of entries
(the prefix's entries, its first block's first) stands for: the last entry with each growing KV cache the chain's
blocks joined with empty slots up to max_len, one concatenation. The prefix cache keeps every ancestor of a held
entry (prefix_cache.py, `chained`), so a chain is complete.
"""

import dataclasses

import jax
import jax.numpy as jnp

from retention.nn import LM, LMCache, LMConfig
from retention.nn.registry import MIXERS
from retention.ops.attention.decode import cut_slots, join_slots
from retention.serve.snapshot import is_kv_cache, resize
from retention.serve.snapshot_value import Snapshot


def _grows(config: LMConfig) -> tuple[bool, ...]:
    """Per entry of LMCache.layers (a layer, or with scan_layers a letter of the period), whether its cache grows."""
    kinds = config.pattern if config.scan_layers else config.layer_kinds
    return tuple(not MIXERS[k].fixed_state for k in kinds)


def _map_growing(config: LMConfig, f, base: LMCache, *others: LMCache) -> LMCache:
    """`base` with each KV cache of a growing layer replaced by f(that cache, the same layer's KV caches in
    `others`), every other cache and array of base kept."""
    kv = lambda x, *xs: f(x, *xs) if is_kv_cache(x) else x  # a growing layer's convolution inputs are base's
    layers = tuple(
        jax.tree.map(kv, *same, is_leaf=is_kv_cache) if grows else same[0]
        for grows, *same in zip(_grows(config), base.layers, *(c.layers for c in others))
    )
    return base._replace(layers=layers)


def kv_only(model: LM) -> bool:
    """Whether every cache of the LM is a growing layer's KV cache (full attention, float or quantized, without a
    convolution): then its snapshot after t tokens is a later snapshot's slots 0..t - 1 with the length, position
    and logits of token t - 1, and `block_entry` can make each boundary's entry from the snapshot after the whole
    prompt.

    Args:
        model: the LM.

    Returns:
        True when every layer grows and holds nothing but its KV cache.
    """
    layers = jax.eval_shape(lambda: model.init_caches(1, 1)).layers
    return all(_grows(model.config)) and all(is_kv_cache(x) for x in jax.tree.leaves(layers, is_leaf=is_kv_cache))


def block_entry(snapshot: Snapshot, start: int, *, end: int | None = None, logits=None) -> Snapshot:
    """The prefix cache's entry for a snapshot at a block boundary: each growing layer's KV cache cut to its slots
    start..end - 1 (new arrays holding just those tokens' keys and values), every other array kept.

    Args:
        snapshot: a float32 snapshot whose full-attention caches hold token t at slot t (a prefill's or extend's).
        start: the first token of the block (its parent entry's length; 0 for the first block).
        end: the boundary, for a snapshot of a `kv_only` model run past it (its lengths and positions set back to
            end); None: the snapshot's length.
        logits (Array | None): with `end`, the logits of token end - 1 [B, V].

    Returns:
        The entry (the snapshot itself when no layer's cache grows).
    """
    if not any(_grows(snapshot.config)):
        return snapshot
    caches = snapshot.caches
    if end is not None:  # the tokens after end are dropped: each row's next position moves back with the length
        back = caches.length - end
        caches = caches._replace(length=jnp.full_like(caches.length, end), position=caches.position - back)
        snapshot = dataclasses.replace(snapshot, logits=logits)
    n = int(caches.length) - start
    cut = lambda kv: cut_slots(kv, start, n)._replace(length=jnp.full_like(kv.length, start + n))
    return dataclasses.replace(snapshot, caches=_map_growing(snapshot.config, cut, caches))


def assemble(model: LM, chain: list[Snapshot], *, max_len: int, step_tokens: int) -> Snapshot:
    """The snapshot a chain of `block_entry` entries stands for, with caches for max_len and step_tokens.

    Args:
        model: the LM the entries were made with.
        chain: the entries of a prefix's blocks, its first block's first (only the last is read when no layer's cache
            grows).
        max_len: the snapshot's caches hold up to this many tokens.
        step_tokens: and are decoded in steps of up to this many tokens.

    Returns:
        The last entry with every growing KV cache the chain's slots followed by empty ones up to max_len.

    Raises:
        ValueError: the prefix is longer than max_len (`resize`).
    """
    last = chain[-1]
    end = int(last.caches.length)
    if any(_grows(model.config)):
        pieces = [entry.caches for entry in chain]
        if max_len > end:  # the empty slots, as a fresh cache of max_len - end slots holds them
            pieces.append(model.init_caches(last.rows, max_len - end, step_tokens=last.step_tokens))
        caches = _map_growing(model.config, lambda kv, *kvs: join_slots(kvs, kv.length), last.caches, *pieces)
        last = dataclasses.replace(last, caches=caches, max_len=max(end, max_len))
    return resize(model, last, max_len=max_len, step_tokens=step_tokens)
