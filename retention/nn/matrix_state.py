"""What the matrix-state mixers share (Gated DeltaNet, GLA, Mamba2): their decode cache, the dispatch between the
full op (or its context-parallel form under a mesh whose "sequence" axis splits the tokens) and the step op
through it, and its size for the registry.

With a cache, the T tokens continue the sequence it holds through the step op; segment_ids None continues each
row's document, and a step whose first token has an id other than the row's last one clears that row's state (as
the power-retention mixer does)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from retention.nn.conv import QKVConvCache
from retention.nn.qkv import conv_cache_bytes, per_token_segment_ids, select_kept
from retention.ops import context_parallel_size, init_matrix_state
from retention.validation import check_int


class MatrixStateCache(NamedTuple):
    """A matrix-state layer's decode cache (D, G, M).

    Attributes:
        state: S [B, H, d_k, d_v], float32.
        segment_id: each row's last segment id [B].
        conv: the short convolution's last inputs; None without a convolution.
    """

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


def run_mixing(
    full_op, context_parallel_op, step_op, args: tuple, *, cache, conv_cache, segment_ids, chunk_size, per_token
):
    """o of full_op(*args) (cache None; under a mesh whose "sequence" axis splits the tokens, its context-parallel
    form `context_parallel_op`) or of step_op(state, *args) continuing the cache: (o, the new cache), or with
    `per_token` (a verify step) the caches after each token, every field stacked [T, ...] (the states by
    `step_states`, conv_cache already the conv caches per token)."""
    if cache is None:
        full_op = context_parallel_op if context_parallel_size() > 1 else full_op
        return full_op(*args, segment_ids=segment_ids, chunk_size=chunk_size), None
    state, last_id = cache.state, cache.segment_id
    if segment_ids is not None:
        state = _clear(state, segment_ids[:, 0] != last_id)
    o, new_state = step_op(state, *args, segment_ids=segment_ids, chunk_size=chunk_size)
    ids_TB = per_token_segment_ids(last_id, segment_ids, args[0].shape[1])
    if per_token:
        return o, MatrixStateCache(step_states(step_op, state, args, segment_ids), ids_TB, conv_cache)
    return o, MatrixStateCache(new_state, ids_TB[-1], conv_cache)


class MatrixStateMixer:
    """The `Mixer` methods of the matrix-state mixers (D, G, M), over the mixer's own `_mix(x, positions,
    segment_ids, cache, per_token)` (cache None: the full forward; else the step op continuing it, with
    `per_token` the caches after each token): a prompt prefills as a decode step of it into the empty cache, the
    cache is `init_matrix_cache` of the mixer's `state_dims` (heads, d_k, d_v) and its `conv`, and a verify step
    rolls back by `select_kept`."""

    def __call__(self, x_BTD, *, positions=None, segment_ids=None):
        """The full forward: y [B, T, d_model] (the chunked op, or its context-parallel form under a mesh that
        splits the sequence)."""
        return self._mix(x_BTD, positions, segment_ids, None, per_token=False)[0]

    def prefill(self, x_BTD, *, positions=None, segment_ids=None, cache: MatrixStateCache):
        """A prompt into a fresh cache: the same as `decode` from it."""
        return self.decode(x_BTD, positions=positions, segment_ids=segment_ids, cache=cache)

    def decode(self, x_BTD, *, positions=None, segment_ids=None, cache: MatrixStateCache):
        """T tokens continuing the cache (rows whose first token starts a new document begin from an empty
        state): (y [B, T, d_model], the new cache)."""
        return self._mix(x_BTD, positions, segment_ids, cache, per_token=False)

    def verify(self, x_BTD, *, positions=None, segment_ids=None, cache: MatrixStateCache):
        """A decode step that returns the caches after each token, every field stacked [T, ...] (`run_mixing`)."""
        return self._mix(x_BTD, positions, segment_ids, cache, per_token=True)

    def init_cache(self, batch: int, max_len: int, dtype=None, *, step_tokens: int = 1) -> MatrixStateCache:
        """An empty state [batch, *state_dims] float32, last segment ids 0 [batch], the conv cache in `dtype`
        (None: float32): the same size at any max_len and step_tokens."""
        return init_matrix_cache(batch, max_len, dtype, state_dims=self.state_dims, conv=self.conv)

    def rollback(self, before: MatrixStateCache, verified: MatrixStateCache, kept: Int[Array, ""]) -> MatrixStateCache:
        """The cache after the first `kept` tokens of a verify step (see `qkv.select_kept`)."""
        return select_kept(before, verified, kept)


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
