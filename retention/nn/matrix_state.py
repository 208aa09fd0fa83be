"""What the matrix-state mixers share (Gated DeltaNet, GLA, Mamba2): their decode cache, the dispatch between the
full op and the step op through it, and its size for the registry.

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


def init_matrix_cache(batch: int, max_len: int, dtype, *, state_dims: tuple[int, int, int], conv) -> MatrixStateCache:
    """An empty state [batch, *state_dims] (heads, d_k, d_v) float32, last segment ids 0 [batch], the cache of the
    `conv` module (a QKVConv, or None) in `dtype` (None: float32): the same size at any max_len."""
    check_int("batch", batch)
    check_int("max_len", max_len)
    state = init_matrix_state(batch, *state_dims)
    conv = None if conv is None else conv.init_cache(batch, jnp.float32 if dtype is None else dtype)
    return MatrixStateCache(state, jnp.zeros((batch,), jnp.int32), conv)


def state_bytes(batch: int, heads: int, d_k: int, d_v: int) -> int:
    """Bytes of a MatrixStateCache without its conv cache: S in float32 and each row's last segment id."""
    return batch * (4 * heads * d_k * d_v + 4)


def matrix_cache_bytes(config, batch: int, max_len: int, step_tokens: int = 1) -> int:
    """A q/k/v mixer's cache: S in float32 (4 d^2 per kv head), each row's last segment id, the conv cache."""
    return state_bytes(batch, config.n_kv_heads, config.head_dim, config.head_dim) + conv_cache_bytes(config, batch)
