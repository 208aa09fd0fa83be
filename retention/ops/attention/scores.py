"""What every softmax path shares: which keys a query sees (causal, optionally a sliding window, one document), the
treatment of non-finite inputs, the accumulation dtype, and the online-softmax update over one block of keys (the
blockwise kernel, the decode step and context parallelism)."""

import jax.numpy as jnp

MASKED = -1e30  # a finite "minus infinity": masked entries are zeroed explicitly, never exp'd into a NaN


def acc_dtype(x):
    """float32 for float32 and narrower inputs, float64 for float64."""
    return jnp.promote_types(x.dtype, jnp.float32)


def visible(q_pos, k_pos, window, q_seg=None, k_seg=None):
    """Causal (and window) mask for query positions [..., r, 1] against key positions [..., 1, c]: query t sees
    keys t-window+1 .. t (all keys <= t for window None); with segment ids (same shapes as the positions, or
    with batch axes in front) only keys of its own document."""
    ok = k_pos <= q_pos
    ok = ok if window is None else ok & (q_pos - k_pos < window)
    return ok if q_seg is None else ok & (q_seg == k_seg)


def poison_nonfinite(q, k, v):
    """(q, k, v) with non-finite tokens made explicit: a query row [.., d] with a NaN or inf becomes all NaN, and
    a token whose key or value has one gets k = NaN (so every row that sees it scores NaN and outputs NaN) and
    v = 0 (so no masked 0 * NaN reaches a row that does not see it)."""
    q = jnp.where(jnp.isfinite(q).all(-1, keepdims=True), q, jnp.asarray(jnp.nan, q.dtype))
    return q, *poison_nonfinite_kv(k, v)


def poison_nonfinite_kv(k, v):
    """(k, v) [..., d] with a token whose key or value has a NaN or inf given k = NaN and v = 0 (`poison_nonfinite`):
    what a KV cache stores, so that every later row that sees the token is NaN in all its channels."""
    bad = ~(jnp.isfinite(k).all(-1, keepdims=True) & jnp.isfinite(v).all(-1, keepdims=True))
    return jnp.where(bad, jnp.asarray(jnp.nan, k.dtype), k), jnp.where(bad, jnp.zeros((), v.dtype), v)


def online_softmax_update(carry, s, ok, v):
    """Fold one block of keys into the running (row max m [..., r], normaliser den [..., r], output acc [..., r, d]):
    scores s [..., r, c] (MASKED where not `ok`), values v [..., c, d] (batch axes broadcast). The output is
    acc / den once every block is in."""
    m, den, acc = carry
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
    corr = jnp.exp(m - m_new)
    return m_new, den * corr + p.sum(-1), acc * corr[..., None] + jnp.matmul(p, v.astype(acc.dtype))
