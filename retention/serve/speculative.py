"""Greedy speculative decoding with rollback: a draft model proposes k tokens, the target checks them in one decode
step of k + 1 tokens, and the caches go back to the longest accepted prefix.

`verify(target, snapshot, tokens)` runs [last, d_1..d_k] through the target in one verify step (`LM.verify_step`)
from a snapshot holding every token before `last`: the target's greedy choice after each, how many drafts it
accepts (j, the leading matches), and the snapshot after [last, d_1..d_j], selected from the step's per-token
caches (`LM.rollback`), with no second target call: a power-retention layer's states after each token from the one
chunk (k + 1 states of D (d + 1) float32 per kv-head: 2.6 MiB per head at d = 64, degree 2, k = 4), a matrix-state
layer's from a scan of k + 1 one-token steps, an attention layer's keys and values cut back to the accepted tokens
(a ring buffer's overwritten slots restored from the pre-verify snapshot, a value the step leaves untouched), the
conv caches per token. The draft keeps one snapshot per proposed token and goes back to the one after the
accepted prefix. `speculative_generate` is a one-slot Engine with a draft (the engine's speculative round,
speculative_round.py, does the same per slot in one compiled call); its tokens equal the target's greedy `generate`.
"""

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from retention.nn import LM
from retention.serve.cache_limits import check_room
from retention.serve.engine import Engine
from retention.serve.snapshot import check_snapshot
from retention.serve.snapshot_value import Snapshot
from retention.validation import check_int


class Verified(NamedTuple):
    """What `verify` returns.

    Attributes:
        choices: the target's greedy token after each of the k + 1 fed tokens [k + 1].
        accepted: the drafts it accepts, 0..k.
        snapshot: the snapshot after the fed tokens up to the accepted ones.
    """

    choices: np.ndarray
    accepted: int
    snapshot: Snapshot


class Speculated(NamedTuple):
    """What `speculative_generate` returns.

    Attributes:
        tokens: the target's greedy continuation [N].
        acceptance_rate: the accepted drafts over all proposed.
        tokens_per_target_call: the tokens produced per target verify call (the first comes from the prefill).
        target_calls: the number of verify calls.
    """

    tokens: np.ndarray
    acceptance_rate: float
    tokens_per_target_call: float
    target_calls: int


def verify(target: LM, snapshot: Snapshot, tokens_1n) -> Verified:
    """Check k drafts with one decode step of the target, and roll its caches back to the accepted ones.

    The step feeds [last, d_1..d_k] from a one-row snapshot that holds every token before `last`; the leading drafts
    the target's greedy choices match are accepted, and the caches are taken from the step's per-token caches. The
    step needs k + 1 <= snapshot.step_tokens (a sliding-window ring buffer has window + step_tokens - 1 slots: slack
    for step_tokens new tokens beside the window).

    Args:
        target: the model that decides.
        snapshot: a one-row snapshot of the target before `last`.
        tokens_1n (Array): [last, d_1..d_k], int [1, k + 1].

    Returns:
        The target's choices, the drafts accepted and the snapshot after them.
    """
    check_snapshot(target, snapshot, "snapshot")
    if snapshot.rows != 1 or getattr(tokens_1n, "ndim", None) != 2 or tokens_1n.shape[0] != 1:
        raise ValueError(f"verify takes one row: a one-row snapshot and tokens [1, k + 1], got {snapshot.rows} rows")
    k = tokens_1n.shape[1] - 1
    if k + 1 > snapshot.step_tokens:
        raise ValueError(
            f"k={k} drafts (k + 1 = {k + 1} tokens a verify step) is larger than the snapshot's step_tokens="
            f"{snapshot.step_tokens} (a sliding window's ring buffer holds window + step_tokens - 1 keys, slack for "
            f"{snapshot.step_tokens} new ones): prefill with step_tokens >= k + 1"
        )
    tokens_1n = jnp.asarray(tokens_1n, jnp.int32)
    check_room(target.config, int(snapshot.caches.length), k + 1, snapshot.max_len, f"k + 1 = {k + 1} tokens")
    logits, verified = target.verify_step(tokens_1n, snapshot.caches)
    choices = np.asarray(jnp.argmax(logits[0], axis=-1))
    drafts = np.asarray(tokens_1n[0, 1:])
    accepted = int(np.argmin(np.append(choices[:k] == drafts, False)))
    caches = target.rollback(snapshot.caches, verified, accepted + 1)
    return Verified(choices, accepted, dataclasses.replace(snapshot, caches=caches, logits=logits[:, accepted]))


def speculative_generate(target: LM, draft: LM, prompt_1T, max_new_tokens: int, *, k: int) -> Speculated:
    """The target's greedy continuation of a one-row prompt, drafted k at a time by `draft` and verified by the
    target, one decode step per k drafts: a one-slot Engine with a draft (engine.py, speculative_round.py).

    Args:
        target: the model whose greedy tokens are returned (scan_layers=False).
        draft: any LM over the same vocabulary.
        prompt_1T (Array): the prompt, int [1, T].
        max_new_tokens: N, the tokens to generate.
        k: drafts per verify step.

    Returns:
        The tokens and the acceptance statistics.
    """
    check_int("max_new_tokens", max_new_tokens)
    check_int("k", k)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft's vocab_size={draft.config.vocab_size} must equal the target's {target.config.vocab_size}"
        )
    prompt_1T = jnp.asarray(prompt_1T, jnp.int32)
    engine = Engine(target, slots=1, max_len=prompt_1T.shape[1] + max_new_tokens + k + 1, draft=draft, draft_tokens=k)
    request = engine.submit(prompt_1T, max_new_tokens=max_new_tokens)
    tokens = engine.run()[request]
    stats = engine.speculation_stats()
    return Speculated(np.array(tokens), stats.acceptance_rate, stats.tokens_per_target_step, stats.rounds)
