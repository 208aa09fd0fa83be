"""Softmax attention baselines with the [B, T, H, d] interface: causal (full or sliding window) and KV-cache decode.

On CPU (and for float32 anywhere) attention runs blockwise with an online softmax: a forward over query blocks
that visits only the key blocks inside the causal band (and window), and a FlashAttention-2 style backward under
`jax.custom_vjp` that recomputes each block's probabilities from the saved log-sum-exp. Neither ever holds a
T x T array, so 64k tokens fit in memory. On GPU, bf16/fp16 inputs take cuDNN through
`jax.nn.dot_product_attention`.
"""

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float, Int

from retention.ops.validation import check_qkv, check_scale

IMPLS = ("auto", "xla", "cudnn", "reference")
DEFAULT_BLOCK = 512
_MASKED = -1e30  # a finite "minus infinity": masked entries are zeroed explicitly, never exp'd into a NaN


def _check_window(window) -> None:
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None (full causal) or a positive int, got {window!r}")


def _acc_dtype(x):
    """float32 for float32 and narrower inputs, float64 for float64."""
    return jnp.promote_types(x.dtype, jnp.float32)


def _allowed(q_pos, k_pos, window):
    """Causal (and window) mask for query positions [..., r, 1] against key positions [..., 1, c]."""
    ok = k_pos <= q_pos
    return ok if window is None else ok & (q_pos - k_pos < window)


def _key_block_range(i, b, nb, window):
    """Key blocks [lo, hi) that query block i can see."""
    lo = 0 if window is None else jnp.maximum(0, (i * b - window + 1) // b)
    return lo, i + 1


def _query_block_range(j, b, nb, window):
    """Query blocks [lo, hi) that can see key block j."""
    hi = nb if window is None else jnp.minimum(nb, (j * b + b - 1 + window - 1) // b + 1)
    return j, hi


def _block_scores(q_blk, k_blk, i, j, b, window):
    """Masked scores [BH, b, b] of query block i against key block j, and the mask."""
    s = jnp.einsum("xrd,xcd->xrc", q_blk, k_blk, preferred_element_type=_acc_dtype(q_blk))
    pos = jnp.arange(b)
    ok = _allowed(i * b + pos[:, None], j * b + pos[None, :], window)
    return jnp.where(ok, s, _MASKED), ok


def _forward(q_XNbd, k_XNbd, v_XNbd, window):
    """Online-softmax forward: (o [X, N, b, d] float32, lse [X, N, b])."""
    X, nb, b, d = q_XNbd.shape
    acc_t = _acc_dtype(q_XNbd)

    def one_query_block(i):
        q_blk = q_XNbd[:, i]

        def body(j, carry):
            m, l, acc = carry
            s, ok = _block_scores(q_blk, k_XNbd[:, j], i, j, b, window)
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
            corr = jnp.exp(m - m_new)
            acc = acc * corr[..., None] + jnp.einsum("xrc,xcd->xrd", p, v_XNbd[:, j].astype(acc_t))
            return m_new, l * corr + p.sum(-1), acc

        lo, hi = _key_block_range(i, b, nb, window)
        init = (jnp.full((X, b), _MASKED, acc_t), jnp.zeros((X, b), acc_t), jnp.zeros((X, b, d), acc_t))
        m, l, acc = jax.lax.fori_loop(lo, hi, body, init)
        return acc / l[..., None], m + jnp.log(l)

    o, lse = jax.lax.map(one_query_block, jnp.arange(nb))
    return jnp.moveaxis(o, 0, 1), jnp.moveaxis(lse, 0, 1)


def _backward(q_XNbd, k_XNbd, v_XNbd, o_XNbd, lse_XNb, do_XNbd, window):
    """FlashAttention-2 backward: outer loop over key blocks, inner over the query blocks that see them."""
    X, nb, b, d = q_XNbd.shape
    f32 = _acc_dtype(q_XNbd)
    delta_XNb = jnp.sum(do_XNbd.astype(f32) * o_XNbd, axis=-1)

    def one_key_block(dq, j):
        k_blk, v_blk = k_XNbd[:, j], v_XNbd[:, j].astype(f32)

        def body(i, carry):
            dq, dk, dv = carry
            q_blk, do_blk = q_XNbd[:, i], do_XNbd[:, i].astype(f32)
            s, ok = _block_scores(q_blk, k_blk, i, j, b, window)
            p = jnp.where(ok, jnp.exp(s - lse_XNb[:, i][..., None]), 0.0)
            dv = dv + jnp.einsum("xrc,xrd->xcd", p, do_blk)
            ds = p * (jnp.einsum("xrd,xcd->xrc", do_blk, v_blk) - delta_XNb[:, i][..., None])
            dk = dk + jnp.einsum("xrc,xrd->xcd", ds, q_blk.astype(f32))
            dq = dq.at[:, i].add(jnp.einsum("xrc,xcd->xrd", ds, k_blk.astype(f32)))
            return dq, dk, dv

        lo, hi = _query_block_range(j, b, nb, window)
        zeros = jnp.zeros((X, b, d), f32)
        dq, dk, dv = jax.lax.fori_loop(lo, hi, body, (dq, zeros, zeros))
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(one_key_block, jnp.zeros((X, nb, b, d), f32), jnp.arange(nb))
    return dq, jnp.moveaxis(dk, 0, 1), jnp.moveaxis(dv, 0, 1)


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _blockwise(q_XNbd, k_XNbd, v_XNbd, window):
    return _forward(q_XNbd, k_XNbd, v_XNbd, window)[0].astype(v_XNbd.dtype)


def _blockwise_fwd(q_XNbd, k_XNbd, v_XNbd, window):
    o, lse = _forward(q_XNbd, k_XNbd, v_XNbd, window)
    return o.astype(v_XNbd.dtype), (q_XNbd, k_XNbd, v_XNbd, o, lse)


def _blockwise_bwd(window, residuals, do_XNbd):
    q, k, v, o, lse = residuals
    dq, dk, dv = _backward(q, k, v, o, lse, do_XNbd, window)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def blockwise_attention(q, k, v, *, window=None, scale, block_size=DEFAULT_BLOCK):
    """Causal softmax attention in blocks of `block_size` (any T: padded, then cropped). Shapes as the op's."""
    B, T, Hq, d = q.shape
    H = k.shape[2]
    b = min(block_size, 1 << max(4, (T - 1).bit_length()))  # no block longer than the sequence needs
    nb = -(-T // b)
    pad = [(0, 0), (0, nb * b - T), (0, 0), (0, 0)]
    to_blocks = lambda x: rearrange(jnp.pad(x, pad), "B (N b) H d -> (B H) N b d", b=b)
    k_rep, v_rep = (jnp.repeat(x, Hq // H, axis=2) for x in (k, v))
    o = _blockwise(to_blocks(q * jnp.asarray(scale, q.dtype)), to_blocks(k_rep), to_blocks(v_rep), window)
    return rearrange(o, "(B H) N b d -> B (N b) H d", B=B)[:, :T]


def dense_attention(q, k, v, *, window=None, scale):
    """Masked dense softmax attention, O(T^2) memory: the oracle for the blockwise and cached paths."""
    T, H = q.shape[1], k.shape[2]
    dtype = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    q_g = rearrange(q.astype(dtype), "B T (H g) d -> B H g T d", H=H)
    s = jnp.einsum("bhgid,bjhd->bhgij", q_g * scale, k.astype(dtype))
    pos = jnp.arange(T)
    s = jnp.where(_allowed(pos[:, None], pos[None, :], window), s, -jnp.inf)
    y = jnp.einsum("bhgij,bjhd->bhgid", jax.nn.softmax(s, axis=-1), v.astype(dtype))
    return rearrange(y, "B H g T d -> B T (H g) d").astype(v.dtype)


def softmax_attention(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    *,
    window: int | None = None,
    scale: float | None = None,
    impl: str = "auto",
) -> Float[Array, "B T Hq d"]:
    """Causal softmax attention; with `window`, query t sees keys t-window+1 .. t. Returns [B, T, Hq, d].

    impl: "auto" (cuDNN on GPU for bf16/fp16, else blockwise), "xla" (blockwise), "cudnn", "reference" (dense).
    """
    check_qkv(q, k, v)
    check_scale(scale)
    _check_window(window)
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    on_gpu = jax.default_backend() == "gpu"
    if impl == "cudnn" or (impl == "auto" and on_gpu and q.dtype in (jnp.bfloat16, jnp.float16)):
        local = None if window is None else (window - 1, 0)
        return jax.nn.dot_product_attention(
            q, k, v, scale=scale, is_causal=True, local_window_size=local, implementation="cudnn"
        )
    if impl == "reference":
        return dense_attention(q, k, v, window=window, scale=scale)
    return blockwise_attention(q, k, v, window=window, scale=scale)


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
    for name, val in (("batch", batch), ("heads", heads), ("head_dim", head_dim), ("max_len", max_len)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    shape = (batch, heads, max_len, head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), pos=jnp.full((max_len,), -1, jnp.int32), length=jnp.zeros((), jnp.int32))


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
    _check_window(window)
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
    acc_t = _acc_dtype(q)
    q_BHmd = rearrange(q.astype(acc_t) * scale, "B n (H g) d -> B H (g n) d", H=H)  # m = g * n query rows
    # Read the cache as it was, with the new keys beside it, and write only after: reading the written cache
    # makes XLA copy the whole cache every step (measured 6x slower at 16k, experiments/PERF_LOG.md).
    s_old = jnp.einsum("bhmd,bhld->bhml", q_BHmd, cache.k, preferred_element_type=acc_t)
    s_new = jnp.einsum("bhmd,bhjd->bhmj", q_BHmd, k_BHnd, preferred_element_type=acc_t)
    row_pos = jnp.tile(new_pos, Hq // H)[:, None]  # the position of each of the m query rows
    ok_old = (cache.pos[None, :] >= 0) & _allowed(row_pos, cache.pos[None, :], window)
    ok_new = _allowed(row_pos, new_pos[None, :], window)
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
