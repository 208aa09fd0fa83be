"""A slot engine with a queue: B requests decoded together, each in its own slot with its own cache, position,
segment and sampling settings; submitted requests wait in a first-come-first-served queue, join (prefilled alone,
or from a one-row Snapshot of any shapes that fit) as slots free, and leave (eos or length) between steps; one
compiled step decodes the whole slot batch.

The slot batch is a stack of one-row LMCaches (a leading slot axis over each cache's arrays), and the step is the
LM's decode step vmapped over it: each slot keeps its own token count and KV-cache fill, so requests of any
lengths share the step, and each request's tokens are those of its run alone. A joining request's cache is
written into its slot by one compiled insert (a snapshot made for another max_len or step_tokens resized first).
With `prefix_cache_bytes` > 0 a joining prompt continues from the longest prefix of whole blocks the engine has
prefilled before (prefix_cache.py: a trie of blocks, LRU under the byte budget; prefix_prefill.py: the snapshots).
With a `draft` model each step is a speculative round (speculative_round.py): the draft proposes draft_tokens
tokens per slot from its own slot caches, kept in step with the target's, the target checks them in one verify step
and each slot keeps its accepted prefix and one token of the target's.
"""

import collections
import dataclasses
from collections.abc import Iterator
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from retention.nn import LM
from retention.serve.cache_limits import check_room
from retention.serve.prefix_cache import PrefixCache, PrefixCacheStats
from retention.serve.prefix_prefill import prefill_cached
from retention.serve.prompts import check_prompt, check_prompt_ids
from retention.serve.quantized_state import STATE_FORMATS, round_trip_states
from retention.serve.sampling import check_sampling, sample
from retention.serve.snapshot import check_snapshot, prefill, resize
from retention.serve.snapshot_value import Snapshot
from retention.serve.speculative_round import SpeculationStats, speculative_round
from retention.validation import check_choice, check_int


@dataclasses.dataclass
class Request:
    """A request, queued or in a slot: its id, settings and the tokens generated so far."""

    id: int
    max_new_tokens: int
    eos_id: int | None
    tokens: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Waiting:
    """A checked request in the queue: what it starts from (a prompt [1, T] or a one-row Snapshot) and how it
    samples."""

    request: Request
    start: jax.Array | Snapshot
    temperature: float
    top_k: int
    key: jax.Array
    draft_start: Snapshot | None = None


class Engine:
    """A slot engine: `slots` requests decoded as one batch, each joining and leaving one compiled decode step, the
    rest waiting in a queue.

    Queue policy: first come, first served. `submit` checks a request and queues it; a queued request joins the
    lowest free slot as soon as one is free (at once when one is free at submit, else at the end of the step
    where a request leaves), in the order submitted, and a request in a slot runs until its eos or max_new_tokens
    (no preemption). So between calls no slot is free while a request waits. A request's tokens are drawn from
    its own key, folded with the token's index (greedy: argmax), and equal those of the request run alone.

    ```python
    engine = Engine(model, slots=4, max_len=4096)
    a = engine.submit(prompt_T, max_new_tokens=64, eos_id=0)
    b = engine.submit(snapshot, max_new_tokens=32, temperature=0.8, key=jax.random.key(1))
    for request_id, token in engine.stream():  # each token as it is made
        ...
    tokens = engine.run()  # {request id: its generated tokens}, once every request has left

    fast = Engine(model, slots=4, max_len=4096, draft=small_model, draft_tokens=4)  # speculative decoding
    fast.submit(prompt_T, max_new_tokens=64)
    fast.run(), fast.speculation_stats().tokens_per_target_step
    ```

    Speculative decoding (`draft`): every step is a round in which the draft (an LM over the same vocabulary, with
    its own slot caches after the same tokens) proposes draft_tokens tokens per slot, the target checks the k + 1
    positions in one verify step for the slot batch, and each slot keeps its accepted drafts and one token of the
    target's (greedy: the target's argmax, so the tokens equal its greedy run alone; sampled: the speculative-sampling
    rule over the sampler's distributions, temperature and top_k applied to both, so each token has the target's
    own sampling distribution, drawn from other random numbers than without a draft). A request stops at its eos or
    max_new_tokens within a round; the tokens after are dropped.

    Args:
        model: the LM.
        slots: the requests decoded at once.
        max_len: each slot's cache holds up to this many tokens, prompt and generated.
        step_tokens: the caches' step size (a W layer's ring buffer holds window + step_tokens - 1 slots); a
            snapshot made for another max_len or step_tokens is resized to the engine's when it joins.
        state_format (int | str | None): 8, 4 or "fp8": every decode step reads the recurrent states re-quantized
            per row, as `generate(..., state_format=...)` does; None: float32.
        prefix_cache_bytes: the automatic prefix cache's byte budget; 0 (the default) turns it off. When on, every
            prompt that joins continues from the longest prefix of whole `prefix_block`s that an earlier prompt of
            this engine ran through (its snapshot: each layer's state, or an A or W layer's keys and values), the
            rest prefilled block by block and each new block boundary's snapshot kept; least recently used entries
            are evicted to stay within the budget (`cache_stats`). A request that starts from a Snapshot bypasses it.
        prefix_block: the tokens of a cached block: prefixes of k * prefix_block tokens are kept.
        draft (LM | None): a draft model for speculative decoding (None: off): the same vocab_size; its caches are
            made for the same max_len (step_tokens 1); with the prefix cache on, its prompts' snapshots are kept in a
            prefix cache of its own of the same budget and block. Needs a target with scan_layers=False (a verify
            step) and state_format None.
        draft_tokens: k, the tokens the draft proposes per slot a round (>= 1); the target's caches are made for
            step_tokens >= k + 1 (its verify step), and a request needs room for max_new_tokens + k tokens.

    Attributes:
        finished: {request id: its generated tokens} for the requests that left.
        requests: each slot's Request, None when the slot is free.

    Raises:
        TypeError: `model` is not an LM.
        ValueError: naming the argument, its value and what is allowed (before any work).
    """

    def __init__(
        self,
        model: LM,
        *,
        slots: int,
        max_len: int,
        step_tokens: int = 1,
        state_format=None,
        prefix_cache_bytes: int = 0,
        prefix_block: int = 64,
        draft: LM | None = None,
        draft_tokens: int = 4,
    ):
        if not isinstance(model, LM):
            raise TypeError(f"model must be an LM, got {type(model).__name__}")
        check_int("slots", slots)
        check_int("max_len", max_len)
        check_int("step_tokens", step_tokens)
        check_int("draft_tokens", draft_tokens)
        if state_format is not None:
            check_choice("state_format", state_format, STATE_FORMATS)
        if draft is not None:
            _check_draft(model, draft, state_format)
            step_tokens = max(step_tokens, draft_tokens + 1)
        self.prefix_cache = PrefixCache(prefix_cache_bytes, prefix_block)  # checks both; owned by this engine
        self.draft, self.draft_tokens = draft, draft_tokens if draft is not None else 0
        self.state_format = state_format
        self.model, self.slots, self.max_len, self.step_tokens = model, slots, max_len, step_tokens
        one = model.init_caches(1, max_len, step_tokens=step_tokens)
        self.caches = jax.tree.map(lambda x: jnp.broadcast_to(x, (slots,) + x.shape), one)
        self.logits_S1V = jnp.zeros((slots, 1, model.config.vocab_size), jnp.float32)
        self.temperature_S = jnp.zeros((slots,), jnp.float32)
        self.top_k_S = jnp.full((slots,), model.config.vocab_size, jnp.int32)
        self.key_S = jax.random.split(jax.random.key(0), slots)
        self.count_S = jnp.zeros((slots,), jnp.int32)
        self.requests: list[Request | None] = [None] * slots
        self.finished: dict[int, list[int]] = {}
        if draft is not None:
            self.draft_prefix_cache = PrefixCache(prefix_cache_bytes, prefix_block)
            one = draft.init_caches(1, max_len, step_tokens=1)
            self.draft_caches = jax.tree.map(lambda x: jnp.broadcast_to(x, (slots,) + x.shape), one)
            self.pending_S = jnp.zeros((slots,), jnp.int32)  # a slot's emitted token not yet fed
            self.has_pending_S = jnp.zeros((slots,), bool)
        self._spec_counts = dict(rounds=0, verified=0, accepted=0)
        self._queue: collections.deque[_Waiting] = collections.deque()
        self._next_id = 0

    def cache_stats(self) -> PrefixCacheStats:
        """The prefix cache's counts (hits, misses, tokens reused, evictions) and what it holds (entries, bytes).

        Returns:
            The PrefixCacheStats.
        """
        return self.prefix_cache.stats()

    def speculation_stats(self) -> SpeculationStats:
        """Speculative decoding's counts: rounds, slot rounds, drafts proposed and accepted, the acceptance rate and
        the tokens per target step (all 0 and 1.0 without a draft or before a round).

        Returns:
            The SpeculationStats.
        """
        rounds, verified, accepted = (self._spec_counts[n] for n in ("rounds", "verified", "accepted"))
        proposed = verified * self.draft_tokens
        return SpeculationStats(
            draft_tokens=self.draft_tokens,
            rounds=rounds,
            verified=verified,
            proposed=proposed,
            accepted=accepted,
            acceptance_rate=accepted / proposed if proposed else 0.0,
            tokens_per_target_step=(verified + accepted) / verified if verified else 1.0,
        )

    @property
    def waiting(self) -> list[int]:
        """The ids of the queued requests, in the order they will join."""
        return [w.request.id for w in self._queue]

    def submit(
        self,
        start,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        key=None,
        eos_id: int | None = None,
        draft_start: Snapshot | None = None,
    ) -> int:
        """Check a request and queue it: it joins a slot at once when one is free, else when one frees (first come,
        first served). A request that cannot run is refused here, before any work.

        Args:
            start (Array | Snapshot): a prompt (int array [T] or [1, T] of ids in [0, vocab_size), at most max_len
                tokens; prefilled alone when it joins) or a one-row Snapshot of this model (any max_len and
                step_tokens: resized when it joins).
            max_new_tokens: the most tokens to generate; the tokens held and these must fit in max_len when a layer's
                cache keeps every token.
            temperature: 0 is greedy; otherwise the sampling temperature.
            top_k: sample from the top_k most likely tokens; None: all.
            key (PRNGKeyArray | None): the request's key (None: key 0; greedy never draws).
            eos_id: the request leaves after generating this token.
            draft_start: with a draft and a Snapshot `start`, the draft's one-row Snapshot after the same tokens
                (required then; refused otherwise).

        Returns:
            The request's id (0, 1, ... in the order submitted).

        Raises:
            TypeError: start is neither an array nor a Snapshot.
            ValueError: naming the argument, its value and what is allowed: a prompt of another shape, empty, with
                ids outside the vocabulary or longer than max_len; a snapshot of another model or of several rows;
                no room for max_new_tokens; sampling settings the model cannot use.
        """
        vocab = self.model.config.vocab_size
        check_int("max_new_tokens", max_new_tokens)
        check_sampling(vocab, temperature=temperature, top_k=top_k, key=key, eos_id=eos_id)
        start = self._checked_start(start)
        held = int(start.caches.length) if isinstance(start, Snapshot) else start.shape[1]
        draft_start = self._checked_draft_start(start, draft_start, held)
        new, what = max_new_tokens + self.draft_tokens, f"max_new_tokens={max_new_tokens}"
        if self.draft is not None:
            what += f" and draft_tokens={self.draft_tokens} (a verify step's)"
            check_room(self.draft.config, held, new, self.max_len, f"the draft's {what}")
        check_room(self.model.config, held, new, self.max_len, what)
        request = Request(self._next_id, max_new_tokens, eos_id)
        self._next_id += 1
        key = jax.random.key(0) if key is None else key
        top_k = vocab if top_k is None else top_k
        self._queue.append(_Waiting(request, start, temperature, top_k, key, draft_start))
        self._admit()
        return request.id

    def _checked_start(self, start) -> jax.Array | Snapshot:
        """`start` checked: a prompt as int32 [1, T], or the snapshot."""
        if isinstance(start, Snapshot):
            check_snapshot(self.model, start, "start")
            if start.rows != 1:
                raise ValueError(
                    f"start must be a one-row snapshot, got {start.rows} rows (fork makes rows, not slots)"
                )
            return start
        prompt = jnp.asarray(start)
        if prompt.ndim == 1:
            prompt = prompt[None]
        if prompt.ndim != 2 or prompt.shape[0] != 1:
            raise ValueError(f"a prompt must be an int array [T] or [1, T], got shape {prompt.shape}")
        check_prompt("start", prompt)
        check_prompt_ids(prompt, None, self.model.config.vocab_size)
        if prompt.shape[1] > self.max_len:
            raise ValueError(
                f"start is a prompt of {prompt.shape[1]} tokens, more than this engine's max_len={self.max_len}"
            )
        return prompt.astype(jnp.int32)

    def _checked_draft_start(self, start, draft_start, held: int) -> Snapshot | None:
        """`draft_start` checked against the engine and `start`: the draft's one-row snapshot of `held` tokens when
        `start` is a Snapshot and there is a draft, else None."""
        if self.draft is None or not isinstance(start, Snapshot):
            if draft_start is not None:
                raise ValueError(
                    "draft_start is only for an engine with a draft and a Snapshot start, got one "
                    + ("with no draft" if self.draft is None else "with a prompt start")
                )
            return None
        if not isinstance(draft_start, Snapshot):
            raise ValueError(
                "draft_start must be the draft's one-row Snapshot after the same tokens when start is a Snapshot "
                f"and the engine has a draft, got {type(draft_start).__name__}"
            )
        check_snapshot(self.draft, draft_start, "draft_start")
        if draft_start.rows != 1 or int(draft_start.caches.length) != held:
            raise ValueError(
                f"draft_start must be a one-row snapshot of start's {held} tokens, got {draft_start.rows} rows of "
                f"{int(draft_start.caches.length)} tokens"
            )
        return draft_start

    def _admit(self) -> None:
        """Queued requests into the free slots, first come first served, each into the lowest free slot."""
        while self._queue and None in self.requests:
            waiting = self._queue.popleft()
            slot = self.requests.index(None)
            snapshot = self._start(self.model, self.prefix_cache, waiting.start, self.step_tokens)
            self.caches, self.logits_S1V = _insert(
                (self.caches, self.logits_S1V), (snapshot.caches, snapshot.logits), slot
            )
            if self.draft is not None:
                start = waiting.start if waiting.draft_start is None else waiting.draft_start
                draft_snapshot = self._start(self.draft, self.draft_prefix_cache, start, 1)
                self.draft_caches = _insert(self.draft_caches, draft_snapshot.caches, slot)
                self.has_pending_S = self.has_pending_S.at[slot].set(False)
            self.temperature_S = self.temperature_S.at[slot].set(waiting.temperature)
            self.top_k_S = self.top_k_S.at[slot].set(waiting.top_k)
            self.key_S = self.key_S.at[slot].set(waiting.key)
            self.count_S = self.count_S.at[slot].set(0)
            self.requests[slot] = waiting.request

    def _start(self, model: LM, prefix_cache: PrefixCache, start, step_tokens: int) -> Snapshot:
        """The snapshot a joining request starts from for `model`: its snapshot resized, or its prompt prefilled
        (through the prefix cache when it is on)."""
        if isinstance(start, Snapshot):  # checked at submit
            if (start.max_len, start.step_tokens) == (self.max_len, step_tokens):
                return start
            return resize(model, start, max_len=self.max_len, step_tokens=step_tokens)
        if prefix_cache.enabled:
            return prefill_cached(model, prefix_cache, start, max_len=self.max_len, step_tokens=step_tokens)
        return prefill(model, start, max_len=self.max_len, step_tokens=step_tokens)

    def step(self) -> dict[int, list[int]]:
        """One token for every request in a slot (one compiled call), or with a draft one speculative round (the
        draft's k steps and the target's verify step: one or more tokens per request); requests that reach their eos
        or max_new_tokens leave (their tokens go to `finished`; a round's tokens after the stop are dropped) and
        queued requests join the slots they free.

        Returns:
            {request id: the step's tokens} for the requests that were in a slot, in slot order.
        """
        active = [r is not None for r in self.requests]
        if not any(active):
            return {}
        made = self._speculate(active) if self.draft is not None else self._decode(active)
        out = {}
        for slot, (request, tokens) in enumerate(zip(self.requests, made)):
            if request is None:
                continue
            kept = []
            for token in tokens:
                kept.append(token)
                if token == request.eos_id or len(request.tokens) + len(kept) == request.max_new_tokens:
                    self.requests[slot] = None
                    break
            request.tokens += kept
            out[request.id] = kept
            if self.requests[slot] is None:
                self.finished[request.id] = request.tokens
        self._admit()
        return out

    def _decode(self, active: list[bool]) -> list[list[int]]:
        """One decode step for the slot batch: each slot's token (a list of one)."""
        graphdef, state = nnx.split(self.model)
        token_S, self.logits_S1V, self.caches = _step(
            graphdef,
            state,
            self.caches,
            self.logits_S1V,
            jnp.asarray(active),
            self.temperature_S,
            self.top_k_S,
            self.key_S,
            self.count_S,
            state_format=self.state_format,
        )
        self.count_S = self.count_S + 1
        return [[token] for token in token_S.tolist()]

    def _speculate(self, active: list[bool]) -> list[list[int]]:
        """One speculative round for the slot batch: each slot's tokens (its first one on its first round, the
        accepted drafts and the target's next one), the caches of both models after all but the last."""
        graphdef, state = nnx.split(self.model)
        draft_graphdef, draft_state = nnx.split(self.draft)
        first, drafts, accepted, token, self.caches, self.draft_caches = speculative_round(
            graphdef,
            state,
            draft_graphdef,
            draft_state,
            self.caches,
            self.draft_caches,
            self.logits_S1V,
            self.pending_S,
            self.has_pending_S,
            jnp.asarray(active),
            self.temperature_S,
            self.top_k_S,
            self.key_S,
            self.count_S,
            k=self.draft_tokens,
        )
        had_pending = self.has_pending_S.tolist()
        self.pending_S, self.has_pending_S, self.count_S = token, jnp.ones_like(self.has_pending_S), self.count_S + 1
        made = []
        rows = zip(active, had_pending, first.tolist(), drafts.tolist(), accepted.tolist(), token.tolist())
        for is_active, pending, first_token, drafted, j, next_token in rows:
            made.append(([] if pending else [first_token]) + drafted[:j] + [next_token])
            if is_active:
                self._spec_counts["verified"] += 1
                self._spec_counts["accepted"] += j
        self._spec_counts["rounds"] += 1
        return made

    def stream(self) -> Iterator[tuple[int, int]]:
        """Step until no request is in a slot or waiting, yielding each token as it is made. Requests submitted
        while iterating join too.

        Yields:
            (request id, token), a step's tokens in slot order.
        """
        while any(r is not None for r in self.requests):
            for request_id, tokens in self.step().items():
                for token in tokens:
                    yield request_id, token

    def run(self) -> dict[int, list[int]]:
        """Step until every request, queued ones too, has left.

        Returns:
            `finished`: {request id: its generated tokens}.
        """
        for _ in self.stream():
            pass
        return self.finished


def _check_draft(model: LM, draft, state_format) -> None:
    """Refuse a draft the engine cannot speculate with (before any work)."""
    if not isinstance(draft, LM):
        raise TypeError(f"draft must be an LM or None, got {type(draft).__name__}")
    if draft.config.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"draft must share the model's vocabulary: draft's vocab_size={draft.config.vocab_size}, the model's "
            f"{model.config.vocab_size}"
        )
    if model.config.scan_layers:
        raise ValueError(
            "a draft needs a model with scan_layers=False (its verify step keeps each layer's per-token caches): "
            "convert_layers(model, False)"
        )
    if state_format is not None:
        raise ValueError(f"state_format={state_format!r} with a draft is not supported: state_format must be None")


@partial(jax.jit, donate_argnums=(0,))
def _insert(batch, one, slot):
    """The slot batch (a pytree with a leading slot axis) with slot `slot` replaced by a one-row value."""
    put = lambda big, row: jax.lax.dynamic_update_index_in_dim(big, row.astype(big.dtype), slot, axis=0)
    return jax.tree.map(put, batch, one)


@partial(jax.jit, static_argnames=("graphdef", "state_format"), donate_argnums=(2,))
def _step(graphdef, state, caches, logits_S1V, active_S, temperature_S, top_k_S, key_S, count_S, *, state_format):
    """(token [S] drawn from each slot's logits, the logits and caches after decoding it, from states re-quantized
    in state_format when given); free slots keep their caches."""
    model = nnx.merge(graphdef, state)
    keys = jax.vmap(jax.random.fold_in)(key_S, count_S)
    token_S = jax.vmap(sample)(logits_S1V[:, 0], keys, temperature_S, top_k_S)  # each slot its own settings
    read = (lambda c: c) if state_format is None else (lambda c: round_trip_states(c, state_format))
    logits, new = jax.vmap(lambda t, c: model.decode_step(t[None, None], read(c)))(token_S, caches)
    keep = lambda n, o: jnp.where(active_S.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
    return token_S, logits[:, :, -1], jax.tree.map(keep, new, caches)
