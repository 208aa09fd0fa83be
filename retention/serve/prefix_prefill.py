"""A prompt prefilled through a PrefixCache (prefix_cache.py): continued from its longest cached prefix (a chunked
prefill from the cache: the rest's queries attend the cached keys, and only the filled slots, at the blockwise
rate: retention/ops/attention/decode.py), an entry kept at each new block boundary.

How the rest is fed depends on what an entry needs. An LM whose every cache is an A layer's keys and values
(`kv_only`) runs the whole rest as one step (one prefill on a miss), and each boundary's entry is cut from the
snapshot after it with that boundary's length, position and logits. Any other LM needs the state of a fixed-size
cache at each boundary, which one step gives only at its end: its rest is fed block by block, a step to each
boundary (and one for the tokens past the last).

An entry is the Snapshot after exactly k * block tokens, as `block_entry` (prefix_blocks.py) keeps it: every cache
that is the same at every length whole (a P, D, G or M layer's fixed-size state, a W layer's ring buffer, the
convolutions' inputs; the last token's logits), and of an A layer's keys and values only the block's own (the
tokens since the entry one block shorter), so the entry is stored `chained` and continued from as the chain of
its prefix's entries (`assemble`: their blocks joined, with room up to the engine's max_len). Its bytes are
`snapshot_bytes`': the bytes it holds. The cache is claimed for the model's config and weights digest first, so a
state made by another model (or the same model before its weights changed) is never continued.
"""

import numpy as np
from jaxtyping import Array

from retention.nn import LM
from retention.serve.cache_limits import growing_layers
from retention.serve.prefix_blocks import assemble, block_entry, kv_only
from retention.serve.prefix_cache import PrefixCache
from retention.serve.prompts import check_prompt, check_prompt_ids
from retention.serve.snapshot import extend_logits, prefill_logits, snapshot_bytes, weights_digest
from retention.serve.snapshot_value import Snapshot


def prefill_cached(model: LM, cache: PrefixCache, prompt_1T, *, max_len: int, step_tokens: int) -> Snapshot:
    """The snapshot after a one-row prompt, continued from its longest prefix in `cache` (the rest prefilled), each
    new block boundary's snapshot stored in `cache` (evicting as its budget needs).

    Greedy continuations equal those of `prefill(model, prompt_1T, ...)` as a snapshot's continuation equals the
    full prompt's: the same function, its float32 rounding in another order (tests/serve/test_prefix_cache.py).

    Args:
        model: the LM.
        cache: an enabled PrefixCache (budget_bytes > 0), used by this model only.
        prompt_1T (Array): the prompt, int [1, T]: ids in the vocabulary, 1 <= T <= max_len.
        max_len: the returned snapshot's caches hold up to this many tokens.
        step_tokens: and are decoded in steps of up to this many tokens (the entries' step_tokens too).

    Returns:
        The one-row snapshot after the prompt, for max_len and step_tokens.

    Raises:
        ValueError: naming `prompt` when it is not one row of ids in the vocabulary, or is empty or longer than max_len.
    """
    check_prompt("prompt", prompt_1T)
    if prompt_1T.shape[0] != 1:
        raise ValueError(f"prompt must be one row [1, T], got shape {tuple(prompt_1T.shape)}")
    if prompt_1T.shape[1] > max_len:
        raise ValueError(f"prompt has {prompt_1T.shape[1]} tokens, more than max_len={max_len}")
    check_prompt_ids(prompt_1T, None, model.config.vocab_size)
    cache.claim((model.config, weights_digest(model)))
    tokens = np.asarray(prompt_1T[0]).tolist()
    T, block, chained = len(tokens), cache.block, bool(growing_layers(model.config))
    done, snapshot = cache.longest(tokens)
    if snapshot is not None:
        chain = cache.chain(tokens[:done]) if chained else [snapshot]
        snapshot = assemble(model, chain, max_len=max_len, step_tokens=step_tokens)
    if chained and kv_only(model):  # every boundary's entry can be cut from the snapshot after the whole rest
        ends = [T]
    else:  # a fixed-size cache is kept whole in each entry: the rest is fed a block at a time to each boundary
        ends = [*range(done + block, T // block * block + 1, block), *([T] if T % block else [])]
    for end in ends:
        snapshot, logits_1nV = _run(model, snapshot, prompt_1T[:, done:end], max_len, step_tokens)
        for boundary in range(done + block, end + 1, block):
            entry = block_entry(snapshot, boundary - block, end=boundary, logits=logits_1nV[:, boundary - end - 1])
            cache.put(tokens[:boundary], entry, snapshot_bytes(entry), chained=chained)
        done = end
    return snapshot


def _run(model: LM, snapshot: Snapshot | None, piece_1n, max_len: int, step_tokens: int) -> tuple[Snapshot, Array]:
    """The snapshot after `piece` (prefilled when `snapshot` is None, else run into it) and the logits of its last m
    tokens [1, m, V]: every token's (m = n) when it runs as one prefill or one step, the last piece's when a ring
    buffer bounds the step (a W layer: the piece fed step_tokens at a time)."""
    if snapshot is None:
        return prefill_logits(model, piece_1n, max_len=max_len, step_tokens=step_tokens)
    return extend_logits(model, snapshot, piece_1n)
