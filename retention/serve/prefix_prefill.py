"""A prompt prefilled through a PrefixCache (prefix_cache.py): continued from its longest cached prefix, the rest
fed block by block, an entry kept at each new block boundary.

An entry is the Snapshot after exactly k * block tokens, as `block_entry` (prefix_blocks.py) keeps it: every cache
that is the same at every length whole (a P, D, G or M layer's fixed-size state, a W layer's ring buffer, the
convolutions' inputs; the last token's logits), and of an A layer's keys and values only the block's own (the
tokens since the entry one block shorter), so the entry is stored `chained` and continued from as the chain of
its prefix's entries (`assemble`: their blocks joined, with room up to the engine's max_len). Its bytes are
`snapshot_bytes`': the bytes it holds. The cache is claimed for the model's config and weights digest first, so a
state made by another model (or the same model before its weights changed) is never continued.
"""

import numpy as np

from retention.nn import LM
from retention.serve.cache_limits import growing_layers
from retention.serve.prefix_blocks import assemble, block_entry
from retention.serve.prefix_cache import PrefixCache
from retention.serve.snapshot import extend_checked, prefill, snapshot_bytes, weights_digest
from retention.serve.snapshot_value import Snapshot


def prefill_cached(model: LM, cache: PrefixCache, prompt_1T, *, max_len: int, step_tokens: int) -> Snapshot:
    """The snapshot after a one-row prompt, continued from its longest prefix in `cache` (the rest prefilled), each
    new block boundary's snapshot stored in `cache` (evicting as its budget needs).

    Greedy continuations equal those of `prefill(model, prompt_1T, ...)` as a snapshot's continuation equals the
    full prompt's: the same function, its float32 rounding in another order (tests/serve/test_prefix_cache.py).

    Args:
        model: the LM.
        cache: an enabled PrefixCache (budget_bytes > 0), used by this model only.
        prompt_1T (Array): the prompt, int32 [1, T], checked (ids in the vocabulary, T <= max_len).
        max_len: the returned snapshot's caches hold up to this many tokens.
        step_tokens: and are decoded in steps of up to this many tokens (the entries' step_tokens too).

    Returns:
        The one-row snapshot after the prompt, for max_len and step_tokens.
    """
    cache.claim((model.config, weights_digest(model)))
    tokens = np.asarray(prompt_1T[0]).tolist()
    T, block, chained = len(tokens), cache.block, bool(growing_layers(model.config))
    done, snapshot = cache.longest(tokens)
    if snapshot is not None:
        chain = cache.chain(tokens[:done]) if chained else [snapshot]
        snapshot = assemble(model, chain, max_len=max_len, step_tokens=step_tokens)
    boundaries = range(done + block, T // block * block + 1, block)
    for end in [*boundaries, *([T] if T % block else [])]:
        piece = prompt_1T[:, done:end]
        if snapshot is None:
            snapshot = prefill(model, piece, max_len=max_len, step_tokens=step_tokens)
        else:
            snapshot = extend_checked(model, snapshot, piece)
        if end % block == 0:
            entry = block_entry(snapshot, end - block)
            cache.put(tokens[:end], entry, snapshot_bytes(entry), chained=chained)
        done = end
    return snapshot
