"""Softmax attention decode against a preallocated KV cache (a ring buffer for a sliding window)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float, Int

from retention.ops.attention.scores import acc_dtype, visible
from retention.ops.attention.validation import check_window
from retention.ops.validation import check_qkv, check_scale
from retention.validation import check_int


class KVCache(NamedTuple):
    """Preallocated keys and values. Slot s holds absolute position pos[s] (-1 when empty); tokens are written
    at slot position % max_len, so a cache shorter than the sequence is a ring buffer (a sliding window)."""

    k: Float[Array, "B H L d"]
    v: Float[Array, "B H L d"]
    pos: Int[Array, " L"]
    length: Int[Array, ""]


def init_kv_cache(batch: int, heads: int, head_dim: int, max_len: int, dtype=jnp.float32) -> KVCache:
    """An empty cache of `max_len` slots: k and v [batch, heads, max_len, head_dim] in `dtype` (heads before
    slots, so a decode step reads each head's keys contiguously instead of transposing the cache)."""
    for name, value in (("batch", batch), ("heads", heads), ("head_dim", head_dim), ("max_len", max_len)):
        check_int(name, value)
    shape = (batch, heads, max_len, head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        pos=jnp.full((max_len,), -1, jnp.int32),
        length=jnp.zeros((), jnp.int32),
    )


def softmax_attention_step(
    cache: KVCache,
    q: Float[Array, "B n Hq d"],
    k: Float[Array, "B n H d"],
    v: Float[Array, "B n H d"],
    *,
    window: int | None = None,
    scale: float | None = None,
) -> tuple[Float[Array, "B n Hq d"], KVCache]:
    """Write n new tokens into the cache in place, then attend each new query to the keys it may see.

    Row i equals row t0 + i of `softmax_attention` over the whole sequence as long as the cache holds every key
    that row sees: max_len >= total length for full attention, >= window + n - 1 for a sliding window.
    Jit the caller with the cache donated (or run it inside a compiled loop) so the write needs no copy.
    """
    check_qkv(q, k, v)
    check_scale(scale)
    check_window(window)
    B, n, Hq, d = q.shape
    H, L = cache.k.shape[1], cache.k.shape[2]
    if cache.k.shape != (B, k.shape[2], L, d) or cache.k.dtype != k.dtype:
        raise ValueError(
            f"cache holds k {cache.k.shape} {cache.k.dtype}; new k {k.shape} {k.dtype} must match on B, H, d and dtype"
        )
    if window is not None and L < window + n - 1:
        raise ValueError(f"a sliding-window cache needs max_len >= window + n - 1 = {window + n - 1}, got {L}")
    scale = d**-0.5 if scale is None else float(scale)
    new_pos = cache.length + jnp.arange(n, dtype=jnp.int32)
    k_BHnd, v_BHnd = (rearrange(x, "B n H d -> B H n d") for x in (k, v))
    acc_t = acc_dtype(q)
    q_BHmd = rearrange(q.astype(acc_t) * scale, "B n (H g) d -> B H (g n) d", H=H)  # m = g * n query rows
    # Read the cache as it was, with the new keys beside it, and write only after: reading the written cache
    # makes XLA copy the whole cache every step (measured 6x slower at 16k, experiments/PERF_LOG.md).
    s_old = jnp.einsum("bhmd,bhld->bhml", q_BHmd, cache.k, preferred_element_type=acc_t)
    s_new = jnp.einsum("bhmd,bhjd->bhmj", q_BHmd, k_BHnd, preferred_element_type=acc_t)
    row_pos = jnp.tile(new_pos, Hq // H)[:, None]  # the position of each of the m query rows
    ok_old = (cache.pos[None, :] >= 0) & visible(row_pos, cache.pos[None, :], window)
    ok_new = visible(row_pos, new_pos[None, :], window)
    s = jnp.concatenate([jnp.where(ok_old, s_old, -jnp.inf), jnp.where(ok_new, s_new, -jnp.inf)], axis=-1)
    p = jax.nn.softmax(s, axis=-1)
    y = jnp.einsum("bhml,bhld->bhmd", p[..., :L], cache.v, preferred_element_type=acc_t)
    y = y + jnp.einsum("bhmj,bhjd->bhmd", p[..., L:], v_BHnd, preferred_element_type=acc_t)
    y = rearrange(y, "B H (g n) d -> B n (H g) d", n=n).astype(v.dtype)
    y, k_cache, v_cache = jax.lax.optimization_barrier((y, cache.k, cache.v))  # the write waits for the read
    if n == 1:
        slot = cache.length % L
        k_cache = jax.lax.dynamic_update_slice_in_dim(k_cache, k_BHnd, slot, axis=2)
        v_cache = jax.lax.dynamic_update_slice_in_dim(v_cache, v_BHnd, slot, axis=2)
    else:
        k_cache = k_cache.at[:, :, new_pos % L].set(k_BHnd)
        v_cache = v_cache.at[:, :, new_pos % L].set(v_BHnd)
    pos = cache.pos.at[new_pos % L].set(new_pos)
    return y, KVCache(k=k_cache, v=v_cache, pos=pos, length=cache.length + n)
