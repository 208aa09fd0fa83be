"""What the matrix-state mixers share (Gated DeltaNet, GLA): their decode cache, the dispatch between the full op
and the step op through it, and its size for the registry.

With a cache, the T tokens continue the sequence it holds through the step op; segment_ids None continues each
row's document, and a step whose first token has an id other than the row's last one clears that row's state (as
the power-retention mixer does)."""

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from retention.nn.conv import QKVConvCache
from retention.nn.qkv import conv_cache_bytes
from retention.ops import context_parallel_size, init_matrix_state
from retention.validation import check_int


class MatrixStateCache(NamedTuple):
    """A matrix-state layer's decode cache: S [B, H, d_k, d_v] float32, each row's last segment id, the conv cache
    (None without a convolution)."""

    state: Float[Array, "B H dk dv"]
    segment_id: Int[Array, " B"]
    conv: QKVConvCache | None


def run_mixing(mixer_name: str, full_op, step_op, args: tuple, *, cache, conv_cache, segment_ids, chunk_size):
    """o of full_op(*args) (cache None) or of step_op(state, *args) continuing the cache: (o, the new cache)."""
    options = dict(segment_ids=segment_ids, chunk_size=chunk_size)
    if cache is None:
        if context_parallel_size() > 1:
            raise NotImplementedError(f"{mixer_name} has no context-parallel form: run it without a 'sequence' axis")
        return full_op(*args, **options), None
    state, last_id = cache.state, cache.segment_id
    if segment_ids is not None:
        state = jnp.where((segment_ids[:, 0] != last_id)[:, None, None, None], 0.0, state)
        last_id = segment_ids[:, -1].astype(jnp.int32)
    o, state = step_op(state, *args, **options)
    return o, MatrixStateCache(state, last_id, conv_cache)


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
