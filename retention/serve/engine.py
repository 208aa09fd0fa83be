"""A slot engine: B requests decoded together, each in its own slot with its own cache, position, segment and
sampling settings; requests join (prefilled alone, or from a one-row Snapshot) and leave (eos or length) between
steps, and one compiled step decodes the whole slot batch.

The slot batch is a stack of one-row LMCaches (a leading slot axis over each cache's arrays), and the step is the
LM's decode step vmapped over it: each slot keeps its own token count and KV-cache fill, so requests of any
lengths share the step, and each request's tokens are those of its run alone. A joining request's cache is
written into its slot by one compiled insert.
"""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from retention.nn import LM
from retention.serve.cache_limits import check_room
from retention.serve.prompts import check_prompt
from retention.serve.quantized_state import STATE_FORMATS, round_trip_states
from retention.serve.sampling import check_sampling, sample
from retention.serve.snapshot import check_snapshot, prefill
from retention.serve.snapshot_value import Snapshot
from retention.validation import check_choice, check_int


@dataclasses.dataclass
class Request:
    """A request in a slot: its id, settings and the tokens generated so far."""

    id: int
    max_new_tokens: int
    eos_id: int | None
    tokens: list[int] = dataclasses.field(default_factory=list)


class Engine:
    """A slot engine: `slots` requests decoded as one batch, each joining and leaving one compiled decode step.

    A request's tokens are drawn from its own key, folded with the token's index (greedy: argmax), and equal those
    of the request run alone.

    ```python
    engine = Engine(model, slots=4, max_len=4096)
    a = engine.submit(prompt_T, max_new_tokens=64, eos_id=0)
    b = engine.submit(snapshot, max_new_tokens=32, temperature=0.8, key=jax.random.key(1))
    tokens = engine.run()  # {request id: its generated tokens}
    ```

    Args:
        model: the LM.
        slots: the requests decoded at once.
        max_len: each slot's cache holds up to this many tokens, prompt and generated.
        step_tokens: the prefill's (a snapshot joining must have been made with the same max_len and step_tokens).
        state_format (int | str | None): 8, 4 or "fp8": every decode step reads the recurrent states re-quantized
            per row, as `generate(..., state_format=...)` does; None: float32.

    Attributes:
        finished: {request id: its generated tokens} for the requests that left.

    Raises:
        TypeError: `model` is not an LM.
    """

    def __init__(self, model: LM, *, slots: int, max_len: int, step_tokens: int = 1, state_format=None):
        if not isinstance(model, LM):
            raise TypeError(f"model must be an LM, got {type(model).__name__}")
        check_int("slots", slots)
        check_int("max_len", max_len)
        check_int("step_tokens", step_tokens)
        if state_format is not None:
            check_choice("state_format", state_format, STATE_FORMATS)
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
        self._next_id = 0

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
        """Put a request in a free slot.

        Args:
            start (Array | Snapshot): a prompt (int array [T] or [1, T], prefilled alone) or a one-row Snapshot made
                with this engine's max_len and step_tokens.
            max_new_tokens: the most tokens to generate.
            temperature: 0 is greedy; otherwise the sampling temperature.
            top_k: sample from the top_k most likely tokens; None: all.
            key (PRNGKeyArray | None): the request's key (None: key 0; greedy never draws).
            eos_id: the request leaves after generating this token.

        Returns:
            The request's id.

        Raises:
            ValueError: every slot holds a request, or the request would not fit in max_len.
        """
        vocab = self.model.config.vocab_size
        check_int("max_new_tokens", max_new_tokens)
        check_sampling(vocab, temperature=temperature, top_k=top_k, key=key, eos_id=eos_id)
        if None not in self.requests:
            raise ValueError(f"the slot batch is full: all slots={self.slots} hold requests (step until one leaves)")
        snapshot = self._snapshot(start)
        held = int(snapshot.caches.length)
        check_room(self.model.config, held, max_new_tokens, self.max_len, f"max_new_tokens={max_new_tokens}")
        slot = self.requests.index(None)
        self.caches, self.logits_S1V = _insert(self.caches, self.logits_S1V, snapshot.caches, snapshot.logits, slot)
        key = jax.random.key(0) if key is None else key
        self.temperature_S = self.temperature_S.at[slot].set(temperature)
        self.top_k_S = self.top_k_S.at[slot].set(vocab if top_k is None else top_k)
        self.key_S = self.key_S.at[slot].set(key)
        self.count_S = self.count_S.at[slot].set(0)
        self.requests[slot] = Request(self._next_id, max_new_tokens, eos_id)
        self._next_id += 1
        return self.requests[slot].id

    def _snapshot(self, start) -> Snapshot:
        """A one-row snapshot with this engine's cache shapes, from a prompt or a snapshot."""
        if not isinstance(start, Snapshot):
            prompt = jnp.asarray(start)
            if prompt.ndim == 1:
                prompt = prompt[None]
            if prompt.ndim != 2 or prompt.shape[0] != 1:
                raise ValueError(f"a prompt must be an int array [T] or [1, T], got shape {prompt.shape}")
            check_prompt("start", prompt)
            return prefill(self.model, prompt, max_len=self.max_len, step_tokens=self.step_tokens)
        check_snapshot(self.model, start, "start")
        if start.rows != 1:
            raise ValueError(f"start must be a one-row snapshot, got {start.rows} rows (fork makes rows, not slots)")
        if (start.max_len, start.step_tokens) != (self.max_len, self.step_tokens):
            raise ValueError(
                f"start was prefilled with max_len={start.max_len}, step_tokens={start.step_tokens}; this engine's "
                f"caches are max_len={self.max_len}, step_tokens={self.step_tokens}"
            )
        return start

    def step(self) -> dict[int, int]:
        """One token for every request in a slot (one compiled call); requests that reach their eos or max_new_tokens
        leave (their tokens go to `finished`).

        Returns:
            {request id: token} for the requests that were in a slot.
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
        return out

    def run(self) -> dict[int, list[int]]:
        """Step until every slot is free.

        Returns:
            `finished`: {request id: its generated tokens}.
        """
        while any(r is not None for r in self.requests):
            self.step()
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
