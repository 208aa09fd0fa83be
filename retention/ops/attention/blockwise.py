"""Blockwise causal softmax attention (full or sliding window): the path on CPU and for float32 anywhere.

A forward over query blocks that visits only the key blocks inside the causal band (and window), folding each in
with the online softmax (`scores.online_softmax_update`), and a FlashAttention-2 style backward under
`jax.custom_vjp` that recomputes each block's probabilities from the saved log-sum-exp. Neither ever holds a
T x T array, so 64k tokens fit in memory. With segment ids a query sees only keys of its own document (the mask;
blocks are not skipped by document). Full causal attention over one document masks only its diagonal blocks.
"""

from functools import partial

import jax
import jax.numpy as jnp
from einops import rearrange

from retention.ops.attention.scores import MASKED, acc_dtype, online_softmax_update, poison_nonfinite, visible

# 256: forward+backward at H = 8, d = 64 on one core, 13.4 s at 16k against 16.8 at 512 (and 0.90 s against 1.15
# at 4k): the backward's [B H, b, b] score blocks stay in cache (experiments/PERF_LOG.md, 2026-12-05)
DEFAULT_BLOCK = 256


def _key_block_range(i, b, window):
    """Key blocks [lo, hi) that query block i can see."""
    lo = 0 if window is None else jnp.maximum(0, (i * b - window + 1) // b)
    return lo, i + 1


def _query_block_range(j, b, nb, window):
    """Query blocks [lo, hi) that can see key block j."""
    hi = nb if window is None else jnp.minimum(nb, (j * b + b - 1 + window - 1) // b + 1)
    return j, hi


def _block_scores(q_blk, k_blk, i, j, b, window, seg_XNb, masked=True):
    """Masked scores [BH, b, b] of query block i against key block j, and the mask (seg_XNb: segment ids, or
    None for one document). `masked` False: a block every query of which sees every key (below the diagonal, no
    window, one document), its scores as they are and the mask True."""
    s = jnp.einsum("xrd,xcd->xrc", q_blk, k_blk, preferred_element_type=acc_dtype(q_blk))
    if not masked:
        return s, True
    pos = jnp.arange(b)
    seg = (None, None) if seg_XNb is None else (seg_XNb[:, i, :, None], seg_XNb[:, j, None, :])
    ok = visible(i * b + pos[:, None], j * b + pos[None, :], window, *seg)
    return jnp.where(ok, s, MASKED), ok


def _only_diagonal_masked(window, seg_XNb) -> bool:
    """Whether a block below the diagonal is seen whole (full causal attention over one document), so that only
    the diagonal block needs the mask: its score blocks skip the mask's compare and select."""
    return window is None and seg_XNb is None


def _forward(q_XNbd, k_XNbd, v_XNbd, seg_XNb, window):
    """Online-softmax forward: (o [X, N, b, d] float32, lse [X, N, b])."""
    X, nb, b, d = q_XNbd.shape
    acc_t = acc_dtype(q_XNbd)

    def one_query_block(i):
        q_blk = q_XNbd[:, i]

        def body(masked):
            def fold(j, carry):
                s, ok = _block_scores(q_blk, k_XNbd[:, j], i, j, b, window, seg_XNb, masked)
                return online_softmax_update(carry, s, ok, v_XNbd[:, j])

            return fold

        lo, hi = _key_block_range(i, b, window)
        init = (jnp.full((X, b), MASKED, acc_t), jnp.zeros((X, b), acc_t), jnp.zeros((X, b, d), acc_t))
        if _only_diagonal_masked(window, seg_XNb):
            m, den, acc = body(True)(i, jax.lax.fori_loop(lo, hi - 1, body(False), init))
        else:
            m, den, acc = jax.lax.fori_loop(lo, hi, body(True), init)
        return acc / den[..., None], m + jnp.log(den)

    o, lse = jax.lax.map(one_query_block, jnp.arange(nb))
    return jnp.moveaxis(o, 0, 1), jnp.moveaxis(lse, 0, 1)


def _backward(q_XNbd, k_XNbd, v_XNbd, seg_XNb, o_XNbd, lse_XNb, do_XNbd, window):
    """FlashAttention-2 backward: outer loop over key blocks, inner over the query blocks that see them."""
    X, nb, b, d = q_XNbd.shape
    f32 = acc_dtype(q_XNbd)
    delta_XNb = jnp.sum(do_XNbd.astype(f32) * o_XNbd, axis=-1)

    def one_key_block(dq, j):
        k_blk, v_blk = k_XNbd[:, j], v_XNbd[:, j].astype(f32)

        def body(masked):
            def fold(i, carry):
                dq, dk, dv = carry
                q_blk, do_blk = q_XNbd[:, i], do_XNbd[:, i].astype(f32)
                s, ok = _block_scores(q_blk, k_blk, i, j, b, window, seg_XNb, masked)
                p = jnp.where(ok, jnp.exp(s - lse_XNb[:, i][..., None]), 0.0)
                dv = dv + jnp.einsum("xrc,xrd->xcd", p, do_blk)
                ds = p * (jnp.einsum("xrd,xcd->xrc", do_blk, v_blk) - delta_XNb[:, i][..., None])
                dk = dk + jnp.einsum("xrc,xrd->xcd", ds, q_blk.astype(f32))
                dq = dq.at[:, i].add(jnp.einsum("xrc,xcd->xrd", ds, k_blk.astype(f32)))
                return dq, dk, dv

            return fold

        lo, hi = _query_block_range(j, b, nb, window)
        zeros = jnp.zeros((X, b, d), f32)
        if _only_diagonal_masked(window, seg_XNb):
            dq, dk, dv = jax.lax.fori_loop(lo + 1, hi, body(False), body(True)(j, (dq, zeros, zeros)))
        else:
            dq, dk, dv = jax.lax.fori_loop(lo, hi, body(True), (dq, zeros, zeros))
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(one_key_block, jnp.zeros((X, nb, b, d), f32), jnp.arange(nb))
    return dq, jnp.moveaxis(dk, 0, 1), jnp.moveaxis(dv, 0, 1)


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _blockwise(q_XNbd, k_XNbd, v_XNbd, seg_XNb, window):
    return _forward(q_XNbd, k_XNbd, v_XNbd, seg_XNb, window)[0].astype(v_XNbd.dtype)


def _blockwise_fwd(q_XNbd, k_XNbd, v_XNbd, seg_XNb, window):
    o, lse = _forward(q_XNbd, k_XNbd, v_XNbd, seg_XNb, window)
    return o.astype(v_XNbd.dtype), (q_XNbd, k_XNbd, v_XNbd, seg_XNb, o, lse)


def _blockwise_bwd(window, residuals, do_XNbd):
    q, k, v, seg, o, lse = residuals
    dq, dk, dv = _backward(q, k, v, seg, o, lse, do_XNbd, window)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None  # segment ids: no cotangent


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def blockwise_attention(q, k, v, *, window=None, segment_ids=None, scale, block_size=DEFAULT_BLOCK):
    """Causal softmax attention in blocks of `block_size` (any T: padded, then cropped). Shapes as the op's;
    segment_ids [B, T] or None. Non-finite inputs as every path (`scores.poison_nonfinite`)."""
    B, T, Hq, _ = q.shape
    H = k.shape[2]
    q, k, v = poison_nonfinite(q, k, v)
    b = min(block_size, 1 << max(4, (T - 1).bit_length()))  # no block longer than the sequence needs
    nb = -(-T // b)
    pad = [(0, 0), (0, nb * b - T), (0, 0), (0, 0)]
    to_blocks = lambda x: rearrange(jnp.pad(x, pad), "B (N b) H d -> (B H) N b d", b=b)
    k_rep, v_rep = (jnp.repeat(x, Hq // H, axis=2) for x in (k, v))
    seg = None
    if segment_ids is not None:  # padded keys come after every real query: causality hides them, whatever the id
        seg = jnp.pad(segment_ids.astype(jnp.int32), [(0, 0), (0, nb * b - T)], constant_values=-1)
        seg = rearrange(jnp.broadcast_to(seg[:, None], (B, Hq, nb * b)), "B H (N b) -> (B H) N b", b=b)
    o = _blockwise(to_blocks(q * jnp.asarray(scale, q.dtype)), to_blocks(k_rep), to_blocks(v_rep), seg, window)
    return rearrange(o, "(B H) N b d -> B (N b) H d", B=B)[:, :T]
