"""One speculative round of the slot engine, for every slot at once: the draft proposes k tokens per slot, the target
checks all k + 1 positions in one verify step per slot (vmapped over the slots, as the engine's decode step is), and
each slot keeps its accepted prefix with the rollback the model already has (`LM.verify_step`'s per-token caches).

The acceptance rule is standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023) over the
distributions the sampler draws from (`sampling_probabilities`: the same temperature and top_k for target and
draft): draft token x is kept with probability min(1, p(x) / q(x)); the first rejected one is replaced by a draw from
normalize(max(0, p - q)), and when all k are kept one more is drawn from p. So every token has the target's own
sampling distribution. At temperature 0 the rule is greedy: keep while the draft's token is the target's argmax, then
the target's argmax, so the tokens are the target's greedy run alone.

A round per slot: the slot's first token (its pending one, or on its first round a draw from its prefill logits),
the drafts d_1..d_k (the draft's k + 1 one-token steps, each step's caches kept so the one after the accepted prefix
can be picked), the target's verify step over [first, d_1..d_k], j drafts accepted, the next token (the replacement
or the bonus one): it is emitted now and fed at the start of the next round. The caches of both models end after
[first, d_1..d_j].
"""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from retention.serve.sampling import sample, sampling_probabilities


@dataclasses.dataclass(frozen=True)
class SpeculationStats:
    """What an engine's speculative decoding did.

    Attributes:
        draft_tokens: k, the drafts proposed per slot a round.
        rounds: the target's verify calls (one per round, all slots at once).
        verified: the slot rounds (a round counts once per active slot).
        proposed: the draft tokens proposed (k per slot round).
        accepted: those the target accepted.
        acceptance_rate: accepted / proposed (0 before any round).
        tokens_per_target_step: the tokens a slot's verify step decided, accepted drafts and the target's own one,
            per slot round: 1 + k * acceptance_rate (1 without speculation); tokens past a stop count too.
    """

    draft_tokens: int
    rounds: int
    verified: int
    proposed: int
    accepted: int
    acceptance_rate: float
    tokens_per_target_step: float


def accept_drafts(target_logits_nV, draft_logits_kV, drafts_k, key, temperature, top_k):
    """The speculative-sampling decision for one row: how many drafts the target keeps and the token after them.

    Args:
        target_logits_nV (Array): the target's logits after [first, d_1..d_k], [k + 1, V].
        draft_logits_kV (Array): the draft's logits each d_i was drawn from, [k, V].
        drafts_k (Array): d_1..d_k, int [k].
        key (PRNGKeyArray): this decision's key.
        temperature (Array): the row's temperature (0: greedy).
        top_k (Array): the row's top_k (V: all).

    Returns:
        (tuple[Array, Array]): accepted, int32 [] in 0..k; and next, int32 [], the replacement for the first
            rejected draft, drawn from normalize(max(0, p - q)), or when all are accepted a draw from the target's
            last distribution (greedy: the target's argmax there).
    """
    k = drafts_k.shape[0]
    rows = lambda x, n: jnp.broadcast_to(x, (n,))  # one row's settings for each of its n positions
    p = sampling_probabilities(target_logits_nV, rows(temperature, k + 1), rows(top_k, k + 1))  # [k + 1, V]
    q = sampling_probabilities(draft_logits_kV, rows(temperature, k), rows(top_k, k))  # [k, V]
    key_u, key_next = jax.random.split(key)
    pick = lambda probs: jnp.take_along_axis(probs[:k], drafts_k[:, None], axis=-1)[:, 0]
    sampled_ok = jax.random.uniform(key_u, (k,)) * pick(q) < pick(p)  # u < p / q, without dividing by q
    greedy_ok = drafts_k == jnp.argmax(target_logits_nV[:k], axis=-1)
    ok = jnp.where(temperature > 0, sampled_ok, greedy_ok)
    accepted = jnp.argmin(jnp.append(ok, False)).astype(jnp.int32)  # the leading accepted drafts
    q_after = jnp.concatenate([q, jnp.zeros_like(q[:1])])[accepted]  # no draft after the k-th: the bonus is from p
    residual = jnp.maximum(p[accepted] - q_after, 0.0)
    residual = jnp.where(residual.sum() > 0, residual, p[accepted])  # p == q everywhere: never rejected
    drawn = jax.random.categorical(key_next, jnp.log(residual))
    greedy = jnp.argmax(target_logits_nV[accepted])
    return accepted, jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)


@partial(jax.jit, static_argnames=("graphdef", "draft_graphdef", "k"), donate_argnums=(4, 5))
def speculative_round(
    graphdef,
    state,
    draft_graphdef,
    draft_state,
    caches,
    draft_caches,
    logits_S1V,
    pending_S,
    has_pending_S,
    active_S,
    temperature_S,
    top_k_S,
    key_S,
    count_S,
    *,
    k,
):
    """One round for every slot (free slots keep their caches).

    Args:
        graphdef: the target's graph (static).
        state: the target's state.
        draft_graphdef: the draft's graph (static).
        draft_state: the draft's state.
        caches: the target's slot caches (a leading slot axis over one-row LMCaches), after each slot's tokens but
            its pending one.
        draft_caches: the draft's, after the same tokens.
        logits_S1V (Array): each slot's prefill logits [S, 1, V] (read on a slot's first round only).
        pending_S (Array): each slot's pending token, int [S] (emitted, not yet fed).
        has_pending_S (Array): bool [S]: False on a slot's first round (its first token is drawn from its logits).
        active_S (Array): bool [S]: the slots holding a request.
        temperature_S (Array): each slot's temperature [S].
        top_k_S (Array): each slot's top_k [S].
        key_S (Array): each slot's key [S].
        count_S (Array): each slot's rounds so far [S] (folded into its key).
        k: the drafts per slot (static).

    Returns:
        (first [S], drafts [S, k], accepted [S], next [S], caches, draft_caches): the round's tokens are first (new
        on a slot's first round), drafts[:accepted] and next; the caches after [first, drafts[:accepted]].
    """
    model, draft = nnx.merge(graphdef, state), nnx.merge(draft_graphdef, draft_state)

    def one(cache, draft_cache, logits_1V, pending, has_pending, temperature, top_k, key):
        key_first, key_drafts, key_accept = jax.random.split(key, 3)
        first = jnp.where(has_pending, pending, sample(logits_1V[0], key_first, temperature, top_k))

        def draft_step(carry, step_key):  # feed a token, draw the next draft from the draft's logits
            draft_c, token = carry
            logits, draft_c = draft.decode_step(token[None, None], draft_c)
            token = sample(logits[0, -1], step_key, temperature, top_k)
            return (draft_c, token), (logits[0, -1], token, draft_c)

        steps = jax.random.split(key_drafts, k + 1)  # k + 1 steps: the last feeds d_k (the caches if all accepted)
        _, (draft_logits, drafts, draft_step_caches) = jax.lax.scan(draft_step, (draft_cache, first), steps)
        drafts, draft_logits = drafts[:k], draft_logits[:k]
        target_logits, verified = model.verify_step(jnp.concatenate([first[None], drafts])[None], cache)
        accepted, token = accept_drafts(target_logits[0], draft_logits, drafts, key_accept, temperature, top_k)
        kept = model.rollback(cache, verified, accepted + 1)
        draft_kept = jax.tree.map(
            lambda t: jax.lax.dynamic_index_in_dim(t, accepted, keepdims=False), draft_step_caches
        )
        return first, drafts, accepted, token, kept, draft_kept

    keys = jax.vmap(jax.random.fold_in)(key_S, count_S)
    first, drafts, accepted, token, new, draft_new = jax.vmap(one)(
        caches, draft_caches, logits_S1V, pending_S, has_pending_S, temperature_S, top_k_S, keys
    )
    keep = lambda n, o: jnp.where(active_S.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
    return first, drafts, accepted, token, jax.tree.map(keep, new, caches), jax.tree.map(keep, draft_new, draft_caches)
