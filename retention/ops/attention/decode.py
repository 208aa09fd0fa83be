"""Softmax attention decode against a preallocated KV cache (a ring buffer for a sliding window).

A step of n new tokens writes them into the cache and attends each new query to the keys it may see, in blocks:
query blocks of up to STEP_QUERY_BLOCK tokens, each folding key blocks of the old cache and then of the new keys
into an online softmax (`scores.online_softmax_update`), with key blocks sized so that one block of scores stays
under STEP_SCORE_BYTES; only the old cache's blocks up to its last filled slot are folded (a dynamic trip count),
so a step of n tokens after t0 scores n x (t0 + n) keys whatever max_len is. A one-token decode step is one block
(one pass over the cache, as a plain softmax); a 65536-token step never holds more than a block of scores. The
budget is the blockwise prefill kernel's block pair at 4 heads (4 x 512 x 512 float32): with 32 MiB blocks a
256-token step ran at a fifth of that kernel's rate per score on CPU (experiments/PERF_LOG.md, issue 44).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float, Int

from retention.ops.attention.scores import (
    MASKED,
    acc_dtype,
    online_softmax_update,
    poison_nonfinite,
    poison_nonfinite_kv,
    visible,
)
from retention.ops.attention.validation import check_window
from retention.ops.validation import FLOAT_DTYPES, check_qkv, check_scale, check_segment_ids, runtime_input_checks
from retention.validation import check_at_runtime, check_int, concrete

STEP_SCORE_BYTES = 1 << 22  # float32 scores of one (query block, key block) pair: 4 MiB
STEP_QUERY_BLOCK = 512


class KVCache(NamedTuple):
    """Preallocated keys and values. Tokens are written at slot position % max_len, so a cache shorter than the
    sequence is a ring buffer (a sliding window).

    Attributes:
        k: keys [B, H, L, d] (heads before slots).
        v: values [B, H, L, d].
        pos: the absolute position each slot holds [L], -1 when empty.
        segment_ids: per batch row, the segment id (document) of each slot's token [B, L].
        length: the tokens written so far, a scalar.
    """

    k: Float[Array, "B H L d"]
    v: Float[Array, "B H L d"]
    pos: Int[Array, " L"]
    segment_ids: Int[Array, "B L"]
    length: Int[Array, ""]


def init_kv_cache(batch: int, heads: int, head_dim: int, max_len: int, dtype=jnp.float32) -> KVCache:
    """An empty cache of `max_len` slots.

    Args:
        batch: rows B.
        heads: kv-heads H.
        head_dim: d.
        max_len: slots L: the longest sequence for full attention; window + n - 1 for a sliding window decoded n
            tokens at a time.
        dtype (DTypeLike): the keys' and values' dtype.

    Returns:
        k and v [batch, heads, max_len, head_dim] in `dtype`, zeros (heads before slots, so a decode step reads each
            head's keys contiguously instead of transposing the cache); every slot empty.
    """
    for name, value in (("batch", batch), ("heads", heads), ("head_dim", head_dim), ("max_len", max_len)):
        check_int(name, value)
    if jnp.dtype(dtype) not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32, bfloat16, float16 or float64, got {dtype!r}")
    shape = (batch, heads, max_len, head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        pos=jnp.full((max_len,), -1, jnp.int32),
        segment_ids=jnp.zeros((batch, max_len), jnp.int32),
        length=jnp.zeros((), jnp.int32),
    )


def fill_kv_cache(
    cache: KVCache,
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    segment_ids: Int[Array, "B T"] | None = None,
) -> KVCache:
    """A prompt's keys, values and segment ids (positions 0..T-1; None: one document, id 0) into an empty cache:
    the last min(T, L) of them at slots position % L (a full-attention cache must hold all T). A token with a
    non-finite key or value is stored poisoned (k = NaN, v = 0: `poison_nonfinite_kv`), as a decode step stores
    it, so a later row of another document that skips it by mask never meets 0 * NaN."""
    k, v = poison_nonfinite_kv(k, v)
    B, T = k.shape[:2]
    L = cache.k.shape[2]
    kept = min(T, L)
    pos = jnp.arange(T - kept, T, dtype=jnp.int32)
    seg = jnp.zeros((B, T), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    to_heads = lambda x, like: rearrange(x[:, T - kept :], "B n H d -> B H n d").astype(like.dtype)
    return KVCache(
        k=cache.k.at[:, :, pos % L].set(to_heads(k, cache.k)),
        v=cache.v.at[:, :, pos % L].set(to_heads(v, cache.v)),
        pos=cache.pos.at[pos % L].set(pos),
        segment_ids=cache.segment_ids.at[:, pos % L].set(seg[:, T - kept :]),
        length=jnp.asarray(T, jnp.int32),
    )


_SLOT_AXIS = {"k": 2, "v": 2, "k_scale": 2, "v_scale": 2, "pos": 0, "segment_ids": 1}


def keep_first(before, after, kept: Int[Array, ""]):
    """The cache `after` (a KVCache or QuantizedKVCache after a step from `before`) cut back to the step's first
    `kept` tokens: the slots its later tokens wrote hold `before`'s entries again (in a ring buffer, the old keys
    they overwrote) and the length is before.length + kept. Exactly the cache of a step of those `kept` tokens,
    with no copy kept but `before` itself."""
    dropped_L = after.pos >= before.length + kept

    def restore(field: str, old, new):
        if field == "length":
            return before.length + kept
        return jnp.where(dropped_L.reshape((-1,) + (1,) * (new.ndim - _SLOT_AXIS[field] - 1)), old, new)

    return type(after)(*(restore(f, getattr(before, f), getattr(after, f)) for f in after._fields))


def move_slots(cache, empty):
    """The tokens of a KV cache in a fresh cache of the same kind with another number of slots: a full-attention
    cache made for another max_len, or a window's ring buffer made for another step size.

    Each slot of `empty` gets the latest token written whose position falls on it (position % its slots) when
    `cache` still holds that token, and stays empty otherwise. So a full-attention cache keeps every token when
    `empty` has a slot for each (the caller checks the room), and a ring buffer keeps its latest min(cache's slots,
    empty's) tokens.

    Args:
        cache (KVCache | QuantizedKVCache): the cache to move.
        empty (KVCache | QuantizedKVCache): a fresh cache of the same kind, rows, heads and head dim.

    Returns:
        `empty` holding cache's tokens, with cache's length.
    """
    L_old, L = cache.pos.shape[0], empty.pos.shape[0]
    slot_L = jnp.arange(L, dtype=jnp.int32)
    wanted_L = slot_L + L * jnp.floor_divide(cache.length - 1 - slot_L, L)  # < 0: no token written falls there
    source_L = wanted_L % L_old
    held_L = (wanted_L >= 0) & (cache.pos[source_L] == wanted_L)

    def move(field: str, old, new):
        if field == "length":
            return old
        moved = jnp.take(old, source_L, axis=_SLOT_AXIS[field])
        return jnp.where(held_L.reshape((-1,) + (1,) * (new.ndim - _SLOT_AXIS[field] - 1)), moved, new)

    return type(cache)(*(move(f, getattr(cache, f), getattr(empty, f)) for f in cache._fields))


def cut_slots(cache, start, n: int):
    """The slots [start, start + n) of a KV cache as a cache of n slots of its own: new arrays holding only those
    rows (a full-attention cache's tokens start..start + n - 1), the length kept.

    Args:
        cache (KVCache | QuantizedKVCache): the cache, with a leading axis over stacked layers' repeats or not.
        start (int | Array): the first slot; one compiled program serves every start.
        n: the slots kept (start + n <= the cache's slots).

    Returns:
        The cache of n slots, of cache's kind.
    """
    lead = cache.pos.ndim - 1

    def cut(field: str, x):
        return x if field == "length" else jax.lax.dynamic_slice_in_dim(x, start, n, axis=_SLOT_AXIS[field] + lead)

    return type(cache)(*(cut(f, getattr(cache, f)) for f in cache._fields))


def join_slots(caches, length):
    """KV caches of one kind, rows, heads and head dim joined slot after slot (one concatenation per field): the
    inverse of cutting a cache into consecutive `cut_slots` pieces.

    Args:
        caches (Sequence[KVCache | QuantizedKVCache]): the pieces, in slot order.
        length (Array): the joined cache's length (the tokens written).

    Returns:
        The cache of their slots together.
    """
    first = caches[0]
    lead = first.pos.ndim - 1

    def join(field: str):
        if field == "length":
            return length
        return jnp.concatenate([getattr(c, field) for c in caches], axis=_SLOT_AXIS[field] + lead)

    return type(first)(*(join(f) for f in first._fields))


def describe_array(x) -> str:
    """An array's shape and dtype for a message, or its type when it is no array."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        return type(x).__name__
    return f"{tuple(x.shape)} {x.dtype}"


def check_cache_slots(cache, name: str, B: int) -> int:
    """The slot bookkeeping both KV caches share: pos [L] int, length [] int (>= 0 when its value is known), with
    L the slots of `cache.k` [B, H, L, c]. Returns L. Raises ValueError naming `name`'s field."""
    L = cache.k.shape[2]
    for field, shape in (("pos", (L,)), ("length", ())):
        x = getattr(cache, field)
        if getattr(x, "shape", None) != shape or not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{name}.{field} must be an int array of shape {shape}, got {describe_array(x)}")
    length = concrete(cache.length)
    if length is not None and int(length) < 0:
        raise ValueError(f"{name}.length must be >= 0 (the tokens written), got {int(length)}")
    return L


def check_kv_cache(cache, k, name: str = "cache") -> None:
    """`cache` is a KVCache for the new keys k [B, n, H, d]: k and v [B, H, L, d] in k's dtype, segment_ids [B, L]
    int, pos and length as `check_cache_slots`. Raises TypeError or ValueError naming the argument."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"{name} must be a KVCache (see init_kv_cache), got {type(cache).__name__}")
    B, _, H, d = k.shape
    for field in ("k", "v"):
        x = getattr(cache, field)
        if getattr(x, "ndim", None) != 4 or x.shape[:2] != (B, H) or x.shape[3] != d or x.dtype != k.dtype:
            raise ValueError(
                f"{name}.{field} must be [B, H, L, d] = [{B}, {H}, L, {d}] in {k.dtype}: a cache must match on B, H, "
                f"d and dtype the new k {tuple(k.shape)} {k.dtype}, got {describe_array(x)}"
            )
    if cache.v.shape != cache.k.shape:
        raise ValueError(f"{name}.v must have {name}.k's shape {cache.k.shape}, got {cache.v.shape}")
    L = check_cache_slots(cache, name, B)
    seg = cache.segment_ids
    if getattr(seg, "shape", None) != (B, L) or not jnp.issubdtype(seg.dtype, jnp.integer):
        raise ValueError(f"{name}.segment_ids must be an int array [B, L] = {(B, L)}, got {describe_array(seg)}")


def last_segment_ids(cache: KVCache) -> Int[Array, " B"]:
    """Each row's segment id of the last token written (0 for an empty cache)."""
    L = cache.k.shape[2]
    last = jax.lax.dynamic_index_in_dim(cache.segment_ids, (cache.length - 1) % L, axis=1, keepdims=False)
    return jnp.where(cache.length > 0, last, 0)


def _key_block(rows: int, S: int) -> int:
    """Keys per block for `rows` = B * Hq * query rows of float32 scores: a power of two under STEP_SCORE_BYTES
    (at least 16), or all S keys when they fit."""
    block = 1 << max(4, (STEP_SCORE_BYTES // (4 * rows)).bit_length() - 1)
    return S if block >= S else block


def _fold_keys(carry, q_blk, q_pos, q_start, keys, window, n_blocks, block: int):
    """Fold the first n_blocks blocks of `block` keys of one source into the online-softmax carry of one query
    block: q_blk [B, H, g, r, d] at positions q_pos [r] whose documents start at positions q_start [B, r]; keys =
    (k [B, H, S, d], v [B, H, S, d], pos [S] (-1: empty)). A query sees the keys from its document's start to
    itself (within the window). The last block starts at S - block (overlapping the one before it; the keys it
    repeats are masked), so no source is padded or copied."""
    k_src, v_src, pos_src = keys
    S = k_src.shape[2]

    def fold(carry, start, first_new):
        k_blk, v_blk = (jax.lax.dynamic_slice_in_dim(x, start, block, axis=2) for x in (k_src, v_src))
        pos = jax.lax.dynamic_slice_in_dim(pos_src, start, block)
        ok = visible(q_pos[:, None], pos[None, :], window) & (pos[None, None, :] >= q_start[:, :, None])
        ok = (ok & (pos >= 0) & (start + jnp.arange(block) >= first_new))[:, None, None]  # [B, 1, 1, r, block]
        s = jnp.einsum("bhgrd,bhkd->bhgrk", q_blk, k_blk.astype(q_blk.dtype), preferred_element_type=q_blk.dtype)
        return online_softmax_update(carry, jnp.where(ok, s, MASKED), ok, v_blk[:, :, None])

    if block == S:
        return fold(carry, 0, 0)
    return jax.lax.fori_loop(0, n_blocks, lambda j, c: fold(c, jnp.minimum(j * block, S - block), j * block), carry)


@jax.named_scope("softmax_attention_step")
def softmax_attention_step(
    cache: KVCache,
    q: Float[Array, "B n Hq d"],
    k: Float[Array, "B n H d"],
    v: Float[Array, "B n H d"],
    *,
    window: int | None = None,
    segment_ids: Int[Array, "B n"] | None = None,
    scale: float | None = None,
    debug_checks: bool = False,
) -> tuple[Float[Array, "B n Hq d"], KVCache]:
    """Write n new tokens into the cache in place, then attend each new query to the keys it may see.

    Row i equals row t0 + i of `softmax_attention` over the whole sequence as long as the cache holds every key
    that row sees: max_len >= total length for full attention, >= window + n - 1 for a sliding window. Jit the
    caller with the cache donated (or run it inside a compiled loop) so the write needs no copy.

    Args:
        cache: the keys and values of the t0 tokens before these (`init_kv_cache` for none).
        q: queries [B, n, Hq, d].
        k: keys [B, n, H, d].
        v: values [B, n, H, d].
        window: as in `softmax_attention`.
        segment_ids: int [B, n]: the new tokens' documents (each query sees only its own document's keys, the
            cache's included; a change of id starts a fresh document, so an id that comes back sees nothing of its
            earlier run: `retention.ops.segments`); None continues each row's last document.
        scale: None is d^-0.5.
        debug_checks: raise ValueError for non-finite q, k, v and for a full-attention overflow, also under jit.

    Returns:
        y: [B, n, Hq, d] in v's dtype.
        cache: the cache holding the new tokens too.

    Raises:
        ValueError: full attention that overflows the cache (n > max_len, or a known length + n > max_len; under jit
            the rows of a step after the cache overflowed are NaN), or a sliding-window cache shorter than
            window + n - 1.
    """
    check_qkv(q, k, v)
    check_scale(scale)
    check_window(window)
    B, n, Hq, d = q.shape
    check_kv_cache(cache, k)
    H, L = cache.k.shape[1], cache.k.shape[2]
    check_segment_ids(segment_ids, B, n)
    if window is not None and L < window + n - 1:
        raise ValueError(f"a sliding-window cache needs max_len >= window + n - 1 = {window + n - 1}, got {L}")
    length = concrete(cache.length)
    if window is None and (n > L or (length is not None and int(length) + n > L)):
        raise ValueError(
            f"a full-attention cache needs max_len >= its length + n = {'?' if length is None else int(length)} + "
            f"{n}, got max_len={L} (init_kv_cache with a larger max_len, or a sliding window)"
        )
    if debug_checks:
        checks = runtime_input_checks({"q": q, "k": k, "v": v}, segment_ids)
        if window is None:
            message = f"cache overflows (debug_checks): a full-attention cache of max_len={L} would hold {{}} tokens"
            checks.append((message, cache.length + n > L, cache.length + n))
        check_at_runtime(checks)
    scale = d**-0.5 if scale is None else float(scale)
    q, k, v = poison_nonfinite(q, k, v)
    seg_new = jnp.broadcast_to(last_segment_ids(cache)[:, None], (B, n)) if segment_ids is None else segment_ids
    seg_new = seg_new.astype(jnp.int32)
    new_pos = cache.length + jnp.arange(n, dtype=jnp.int32)
    k_BHnd, v_BHnd = (rearrange(x, "B n H d -> B H n d") for x in (k, v))
    y = _attend(
        cache,
        rearrange(q.astype(acc_dtype(q)) * scale, "B n (H g) d -> B H g n d", H=H),
        new_pos,
        _document_start_positions(cache, seg_new, new_pos),
        (k_BHnd, v_BHnd, new_pos),
        window,
    )
    if window is None:  # the cache overflowed before this step: the keys these rows need are gone
        y = jnp.where(cache.length > L, jnp.nan, y)
    y = rearrange(y, "B H g n d -> B n (H g) d").astype(v.dtype)
    # Read the cache as it was, with the new keys beside it, and write only after: reading the written cache
    # makes XLA copy the whole cache every step (measured 6x slower at 16k, experiments/PERF_LOG.md).
    y, k_cache, v_cache, seg_cache = jax.lax.optimization_barrier((y, cache.k, cache.v, cache.segment_ids))
    if n == 1:
        slot = cache.length % L
        k_cache = jax.lax.dynamic_update_slice_in_dim(k_cache, k_BHnd, slot, axis=2)
        v_cache = jax.lax.dynamic_update_slice_in_dim(v_cache, v_BHnd, slot, axis=2)
        seg_cache = jax.lax.dynamic_update_slice_in_dim(seg_cache, seg_new, slot, axis=1)
    else:
        k_cache = k_cache.at[:, :, new_pos % L].set(k_BHnd)
        v_cache = v_cache.at[:, :, new_pos % L].set(v_BHnd)
        seg_cache = seg_cache.at[:, new_pos % L].set(seg_new)
    pos = cache.pos.at[new_pos % L].set(new_pos)
    return y, KVCache(k=k_cache, v=v_cache, pos=pos, segment_ids=seg_cache, length=cache.length + n)


def _document_start_positions(cache: KVCache, seg_new_Bn, new_pos_n) -> Int[Array, "B n"]:
    """The position where each new token's document starts: its last change of segment id, in the step or before
    it (the last slot of another id than the row's last one, + 1: the cache holds the latest tokens, so an older
    change is before every slot; 0 when there is none). A change of id always starts a fresh document."""
    last_B = last_segment_ids(cache)
    other_BL = (cache.pos[None] >= 0) & (cache.segment_ids != last_B[:, None])
    cache_start_B = jnp.max(jnp.where(other_BL, cache.pos[None] + 1, 0), axis=1)
    previous_Bn = jnp.concatenate([last_B[:, None], seg_new_Bn[:, :-1]], axis=1)
    step_start_Bn = jax.lax.cummax(jnp.where(seg_new_Bn != previous_Bn, new_pos_n[None], -1), axis=1)
    return jnp.where(step_start_Bn >= 0, step_start_Bn, cache_start_B[:, None])


def _filled_slots(cache: KVCache) -> Int[Array, ""]:
    """1 + the last slot that holds a token (0 for an empty cache): a full-attention cache fills its slots from 0
    in order, so a step folds only the key blocks up to its length, not every slot of max_len."""
    slots_L = jnp.arange(1, cache.pos.shape[0] + 1, dtype=jnp.int32)
    return jnp.max(jnp.where(cache.pos >= 0, slots_L, 0))


def _attend(cache: KVCache, q_BHgnd, q_pos, q_start, new_keys, window):
    """The n queries [B, H, g, n, d] (scaled, accumulation dtype) against the old cache and the new keys, in query
    blocks of STEP_QUERY_BLOCK rows: [B, H, g, n, d] (acc / den of the online softmax)."""
    B, H, g, n, d = q_BHgnd.shape
    L = cache.k.shape[2]
    rows = min(n, STEP_QUERY_BLOCK)
    n_q = -(-n // rows)
    pad = n_q * rows - n  # padded query rows see whatever they see, and are cropped
    q_BHgnd = jnp.pad(q_BHgnd, [(0, 0)] * 3 + [(0, pad), (0, 0)])
    q_pos = jnp.pad(q_pos, (0, pad), mode="edge")
    q_start = jnp.pad(q_start, [(0, 0), (0, pad)], mode="edge")
    old_keys = (cache.k, cache.v, cache.pos)
    old_block, new_block = _key_block(B * H * g * rows, L), _key_block(B * H * g * rows, n)
    old_blocks = -(-_filled_slots(cache) // old_block)  # the blocks after the last filled slot hold no key

    def one_query_block(i):
        lo = i * rows
        q_blk = jax.lax.dynamic_slice_in_dim(q_BHgnd, lo, rows, axis=3)
        pos = jax.lax.dynamic_slice_in_dim(q_pos, lo, rows)
        start = jax.lax.dynamic_slice_in_dim(q_start, lo, rows, axis=1)
        zeros = jnp.zeros(q_blk.shape[:-1], q_blk.dtype)
        carry = (jnp.full_like(zeros, MASKED), zeros, jnp.zeros_like(q_blk))
        carry = _fold_keys(carry, q_blk, pos, start, old_keys, window, old_blocks, old_block)
        seen_new = -(-jnp.minimum(n, lo + rows) // new_block)  # new-key blocks up to this block's last row
        _, den, acc = _fold_keys(carry, q_blk, pos, start, new_keys, window, seen_new, new_block)
        return acc / den[..., None]

    if n_q == 1:
        return one_query_block(0)[:, :, :, :n]
    out = jax.lax.map(one_query_block, jnp.arange(n_q))  # [n_q, B, H, g, rows, d]
    return rearrange(out, "N B H g r d -> B H g (N r) d")[:, :, :, :n]
