"""What the matrix-state mixers share (Gated DeltaNet, GLA): their decode cache, the dispatch between the full op
and the step op through it, and its size for the registry.

With a cache, the T tokens continue the sequence it holds through the step op; segment_ids None continues each
row's document, and a step whose first token has an id other than the row's last one clears that row's state (as
the power-retention mixer does)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from retention.nn.conv import QKVConvCache
from retention.nn.qkv import conv_cache_bytes, trail_segment_ids
from retention.ops import context_parallel_size, init_matrix_state
from retention.validation import check_int


class MatrixStateCache(NamedTuple):
    """A matrix-state layer's decode cache: S [B, H, d_k, d_v] float32, each row's last segment id, the conv cache
    (None without a convolution)."""

    state: Float[Array, "B H dk dv"]
    segment_id: Int[Array, " B"]
    conv: QKVConvCache | None


def _clear(state_BHkv, rows_B):
    return jnp.where(rows_B[:, None, None, None], 0.0, state_BHkv)


def step_states(step_op, state, args: tuple, segment_ids) -> Float[Array, "T B H dk dv"]:
    """The state after each of the T tokens of args (each [B, T, ...] or None), one token at a time (a scan of the
    step op; a change of segment id inside the step clears the row, as the chunked step does)."""
    T = args[0].shape[1]

    def one(state, t):
        token = [None if a is None else jax.lax.dynamic_slice_in_dim(a, t, 1, axis=1) for a in args]
        if segment_ids is not None:
            previous = jax.lax.dynamic_index_in_dim(segment_ids, jnp.maximum(t - 1, 0), axis=1, keepdims=False)
            state = _clear(state, (t > 0) & (segment_ids[:, t] != previous))
        _, state = step_op(state, *token)
        return state, state

    return jax.lax.scan(one, state, jnp.arange(T))[1]


def run_mixing(mixer_name: str, full_op, step_op, args: tuple, *, cache, conv_cache, segment_ids, chunk_size, trail):
    """o of full_op(*args) (cache None) or of step_op(state, *args) continuing the cache: (o, the new cache), or
    with `trail` (a verify step) the caches after each token, every field stacked [T, ...] (the states by
    `step_states`, conv_cache already the conv caches per token)."""
    options = dict(segment_ids=segment_ids, chunk_size=chunk_size)
    if cache is None:
        if context_parallel_size() > 1:
            raise NotImplementedError(f"{mixer_name} has no context-parallel form: run it without a 'sequence' axis")
        return full_op(*args, **options), None
    state, last_id = cache.state, cache.segment_id
    if segment_ids is not None:
        state = _clear(state, segment_ids[:, 0] != last_id)
    o, new_state = step_op(state, *args, **options)
    ids_TB = trail_segment_ids(last_id, segment_ids, args[0].shape[1])
    if trail:
        return o, MatrixStateCache(step_states(step_op, state, args, segment_ids), ids_TB, conv_cache)
    return o, MatrixStateCache(new_state, ids_TB[-1], conv_cache)


def init_matrix_cache(mixer, batch: int, max_len: int, dtype) -> MatrixStateCache:
    """An empty state [batch, kv_heads, head_dim, head_dim] float32, last segment ids 0 [batch], the conv cache in
    `dtype` (None: float32): the same size at any max_len."""
    check_int("batch", batch)
    check_int("max_len", max_len)
    state = init_matrix_state(batch, mixer.kv_heads, mixer.head_dim, mixer.head_dim)
    conv = None if mixer.conv is None else mixer.conv.init_cache(batch, jnp.float32 if dtype is None else dtype)
    return MatrixStateCache(state, jnp.zeros((batch,), jnp.int32), conv)


def matrix_cache_bytes(config, batch: int, max_len: int, step_tokens: int = 1) -> int:
    """S in float32 (4 d^2 per kv head), each row's last segment id, the conv cache."""
    return batch * (4 * config.n_kv_heads * config.head_dim**2 + 4) + conv_cache_bytes(config, batch)
