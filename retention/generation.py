"""Sampling from an LM with its caches: prefill the prompt, then every new token inside one compiled loop.

Retention layers carry a fixed-size state, so the loop's memory does not grow with the context for them;
attention layers carry a KV cache of prompt + new tokens (or a window's worth for sliding-window layers).
Prompts of different lengths run as one batch, left-padded: the padding is a document of its own (segment id 0,
the prompt 1), so every row sees only its prompt, from RoPE position 0, as if generated alone.

`generate` is built on the serving layer's pieces (retention/serve/: prompts, the sampler and its settings, the
caches' room, snapshots to start from, quantized states), which the slot engine shares; serving never imports it.
"""

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Int, PRNGKeyArray

from retention.nn.model import LM
from retention.serve.cache_limits import check_room
from retention.serve.prompts import check_prompt, check_prompt_ids, prompt_segments
from retention.serve.quantized_state import STATE_FORMATS, round_trip_states
from retention.serve.sampling import check_sampling, sample
from retention.serve.snapshot import check_snapshot, extend_checked
from retention.validation import check_choice, check_int


class Generated(NamedTuple):
    """What `generate` returns.

    Attributes:
        tokens: each prompt row then its continuation [B, T0 + N]; eos_id after a row's first eos.
        lengths: T0 + the tokens each row generated up to and including its first eos [B] (T0 + N: none).
    """

    tokens: Int[Array, "B T0+N"]
    lengths: Int[Array, " B"]


def generate(
    model: LM,
    prompt_BT: Int[Array, "B T0"],
    max_new_tokens: int,
    *,
    prompt_lengths: Int[Array, " B"] | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    key: PRNGKeyArray | None = None,
    eos_id: int | None = None,
    start=None,
    state_format=None,
) -> Generated:
    """Continue each prompt row by up to max_new_tokens tokens.

    The prefill and the whole token loop (a lax.while_loop of decode steps) run in one compiled function, with no
    host round trip per token.

    ```python
    out = retention.generate(model, prompt_BT, 64, temperature=0.8, top_k=50, key=jax.random.key(0), eos_id=0)
    out.tokens[b, : out.lengths[b]]  # row b: its prompt and what it generated
    ```

    Args:
        model: the LM.
        prompt_BT: the prompts [B, T0]; ids in [0, vocab_size) (checked when the prompt's values are known). With
            `start`, a suffix [B, n >= 0] run into the snapshot.
        max_new_tokens: N, the most tokens each row generates.
        prompt_lengths: ragged prompts [B] (1 <= length <= T0), left-padded: row b's prompt is its last
            prompt_lengths[b] tokens (the padding's values are ignored and returned as given); each row continues as
            its prompt alone would. None with `start`.
        temperature: 0 is greedy (argmax) and needs no `key`; otherwise tokens are drawn with `key`.
        top_k: draw from the top_k most likely tokens; None: all.
        key: the sampling key.
        eos_id: a row stops at its first generated eos_id: the positions after it hold eos_id and `lengths` says where
            each row stopped; the loop ends when every row has.
        start (Snapshot | None): a snapshot (retention.prefill) to continue from; tokens then holds the suffix and its
            continuation, and each row continues as the snapshot's prompt followed by the suffix would (greedy: token
            for token; sampled: with the same key, the same draws).
        state_format (int | str | None): 8, 4 or "fp8": the recurrent states re-quantized per row after the prompt and
            after every decode step (`retention.serve.quantized_state.round_trip_states`), as a state stored
            quantized; None: float32.

    Returns:
        The tokens [B, T0 + N] and each row's length [B].

    Raises:
        ValueError: an empty prompt, ids or eos_id outside [0, vocab_size), a negative or non-finite temperature,
            top_k outside [1, vocab_size], or a snapshot of another model.
    """
    check_int("max_new_tokens", max_new_tokens)
    vocab = model.config.vocab_size
    check_sampling(vocab, temperature=temperature, top_k=top_k, key=key, eos_id=eos_id)
    if state_format is not None:
        check_choice("state_format", state_format, STATE_FORMATS)
    greedy = temperature == 0
    check_prompt("prompt", prompt_BT, empty=start is not None)  # a snapshot's suffix may be empty
    segment_ids = None if prompt_lengths is None else prompt_segments(prompt_lengths, *prompt_BT.shape)
    check_prompt_ids(prompt_BT, segment_ids, vocab)
    graphdef, state = nnx.split(model)
    key = jax.random.key(0) if key is None else key  # greedy: never drawn from
    eos = jnp.int32(-1 if eos_id is None else eos_id)
    prompt_BT = jnp.asarray(prompt_BT, jnp.int32)
    options = {"max_new_tokens": max_new_tokens, "top_k": top_k, "greedy": greedy, "state_format": state_format}
    if start is not None:
        check_snapshot(model, start, "start", state)
        if prompt_lengths is not None:
            raise ValueError("prompt_lengths must be None with start= (the snapshot holds each row's prompt)")
        start = extend_checked(model, start, prompt_BT)
        held = int(start.caches.length)
        check_room(model.config, held, max_new_tokens, start.max_len, f"max_new_tokens={max_new_tokens}")
        new_BN = _continue(graphdef, state, start.logits, start.caches, key, jnp.float32(temperature), eos, **options)
        return Generated(jnp.concatenate([prompt_BT, new_BN], axis=1), prompt_BT.shape[1] + _stopped(new_BN, eos))
    return Generated(*_generate(graphdef, state, prompt_BT, segment_ids, key, jnp.float32(temperature), eos, **options))


STATIC = ("graphdef", "max_new_tokens", "top_k", "greedy", "state_format")


@partial(jax.jit, static_argnames=STATIC)
def _generate(graphdef, state, prompt_BT, segment_ids, key, temperature, eos, *, max_new_tokens, **options):
    """(tokens [B, T0 + N], lengths [B]); eos = -1 matches no token (no eos_id)."""
    model = nnx.merge(graphdef, state)
    T0 = prompt_BT.shape[1]
    real_BT = prompt_BT if segment_ids is None else jnp.where(segment_ids == 1, prompt_BT, 0)  # padding: never seen
    logits, caches = model.prefill(real_BT, T0 + max_new_tokens, segment_ids=segment_ids)
    new_BN = _sample_loop(model, logits[:, -1], caches, key, temperature, eos, max_new_tokens, **options)
    return jnp.concatenate([prompt_BT, new_BN], axis=1), T0 + _stopped(new_BN, eos)


@partial(jax.jit, static_argnames=STATIC)
def _continue(graphdef, state, logits_BV, caches, key, temperature, eos, *, max_new_tokens, **options):
    """The new tokens [B, N] after caches whose last token's logits are logits_BV."""
    model = nnx.merge(graphdef, state)
    return _sample_loop(model, logits_BV, caches, key, temperature, eos, max_new_tokens, **options)


def _stopped(new_BN, eos) -> Int[Array, " B"]:
    """The tokens each row generated up to and including its first eos (N: none)."""
    is_eos_BN = new_BN == eos
    stopped_B = jnp.where(jnp.any(is_eos_BN, axis=1), jnp.argmax(is_eos_BN, axis=1) + 1, new_BN.shape[1])
    return stopped_B.astype(jnp.int32)


def _sample_loop(
    model, logits_BV, caches, key, temperature, eos, N: int, *, top_k, greedy, state_format
) -> Int[Array, "B N"]:
    """N new tokens: the first drawn from logits_BV (with the first of N keys split from `key`), each next one
    from a decode step of the one before (its states re-quantized with a state_format); rows after their first
    eos hold eos."""
    if state_format is not None:
        requantize = lambda c: round_trip_states(c, state_format)
    else:
        requantize = lambda c: c
    caches = requantize(caches)
    temperature = 0.0 if greedy else temperature  # a Python 0: the sampler takes the argmax and draws nothing
    B = logits_BV.shape[0]
    keys = jax.random.split(key, N)
    first_B = sample(logits_BV, keys[0], temperature, top_k)
    new_BN = jnp.full((B, N), jnp.maximum(eos, 0), jnp.int32).at[:, 0].set(first_B)

    def body(carry):
        i, new_BN, caches, done_B = carry
        last_B1 = jax.lax.dynamic_slice_in_dim(new_BN, i - 1, 1, axis=1)
        logits, caches = model.decode_step(last_B1, caches)
        caches = requantize(caches)
        token_B = jnp.where(done_B, eos, sample(logits[:, -1], keys[i], temperature, top_k))
        new_BN = jax.lax.dynamic_update_slice_in_dim(new_BN, token_B[:, None], i, axis=1)
        return i + 1, new_BN, caches, done_B | (token_B == eos)

    running = lambda carry: (carry[0] < N) & ~jnp.all(carry[3])
    return jax.lax.while_loop(running, body, (jnp.int32(1), new_BN, caches, first_B == eos))[1]
