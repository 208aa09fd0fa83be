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
    ```

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
    ):
        if not isinstance(model, LM):
            raise TypeError(f"model must be an LM, got {type(model).__name__}")
        check_int("slots", slots)
        check_int("max_len", max_len)
        check_int("step_tokens", step_tokens)
        if state_format is not None:
            check_choice("state_format", state_format, STATE_FORMATS)
        self.prefix_cache = PrefixCache(prefix_cache_bytes, prefix_block)  # checks both; owned by this engine
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
        self._queue: collections.deque[_Waiting] = collections.deque()
        self._next_id = 0

    def cache_stats(self) -> PrefixCacheStats:
        """The prefix cache's counts (hits, misses, tokens reused, evictions) and what it holds (entries, bytes).

        Returns:
            The PrefixCacheStats.
        """
        return self.prefix_cache.stats()

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
        check_room(self.model.config, held, max_new_tokens, self.max_len, f"max_new_tokens={max_new_tokens}")
        request = Request(self._next_id, max_new_tokens, eos_id)
        self._next_id += 1
        key = jax.random.key(0) if key is None else key
        self._queue.append(_Waiting(request, start, temperature, vocab if top_k is None else top_k, key))
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

    def _admit(self) -> None:
        """Queued requests into the free slots, first come first served, each into the lowest free slot."""
        while self._queue and None in self.requests:
            waiting = self._queue.popleft()
            slot = self.requests.index(None)
            if isinstance(waiting.start, Snapshot):
                snapshot = resize(self.model, waiting.start, max_len=self.max_len, step_tokens=self.step_tokens)
            elif self.prefix_cache.enabled:
                snapshot = prefill_cached(
                    self.model, self.prefix_cache, waiting.start, max_len=self.max_len, step_tokens=self.step_tokens
                )
            else:
                snapshot = prefill(self.model, waiting.start, max_len=self.max_len, step_tokens=self.step_tokens)
            self.caches, self.logits_S1V = _insert(self.caches, self.logits_S1V, snapshot.caches, snapshot.logits, slot)
            self.temperature_S = self.temperature_S.at[slot].set(waiting.temperature)
            self.top_k_S = self.top_k_S.at[slot].set(waiting.top_k)
            self.key_S = self.key_S.at[slot].set(waiting.key)
            self.count_S = self.count_S.at[slot].set(0)
            self.requests[slot] = waiting.request

    def step(self) -> dict[int, int]:
        """One token for every request in a slot (one compiled call); requests that reach their eos or max_new_tokens
        leave (their tokens go to `finished`) and queued requests join the slots they free.

        Returns:
            {request id: token} for the requests that were in a slot, in slot order.
        """
        active = [r is not None for r in self.requests]
        if not any(active):
            return {}
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
        out = {}
        for slot, (request, token) in enumerate(zip(self.requests, token_S.tolist())):
            if request is None:
                continue
            request.tokens.append(token)
            out[request.id] = token
            if token == request.eos_id or len(request.tokens) == request.max_new_tokens:
                self.finished[request.id] = request.tokens
                self.requests[slot] = None
        self._admit()
        return out

    def stream(self) -> Iterator[tuple[int, int]]:
        """Step until no request is in a slot or waiting, yielding each token as it is made. Requests submitted
        while iterating join too.

        Yields:
            (request id, token), a step's tokens in slot order.
        """
        while any(r is not None for r in self.requests):
            yield from self.step().items()

    def run(self) -> dict[int, list[int]]:
        """Step until every request, queued ones too, has left.

        Returns:
            `finished`: {request id: its generated tokens}.
        """
        for _ in self.stream():
            pass
        return self.finished


@partial(jax.jit, donate_argnums=(0, 1))
def _insert(caches, logits_S1V, one_caches, one_logits_1V, slot):
    """The slot batch with slot `slot`'s caches and logits replaced by a one-row snapshot's."""
    put = lambda big, one: jax.lax.dynamic_update_index_in_dim(big, one.astype(big.dtype), slot, axis=0)
    return jax.tree.map(put, caches, one_caches), put(logits_S1V, one_logits_1V)


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
