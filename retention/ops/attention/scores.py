"""What every softmax path shares: which keys a query sees (causal, optionally a sliding window), the accumulation
dtype, and the online-softmax update over one block of keys (the blockwise kernel and context parallelism)."""

import jax.numpy as jnp

MASKED = -1e30  # a finite "minus infinity": masked entries are zeroed explicitly, never exp'd into a NaN


def acc_dtype(x):
    """float32 for float32 and narrower inputs, float64 for float64."""
    return jnp.promote_types(x.dtype, jnp.float32)


def visible(q_pos, k_pos, window):
    """Causal (and window) mask for query positions [..., r, 1] against key positions [..., 1, c]: query t sees
    keys t-window+1 .. t (all keys <= t for window None)."""
    ok = k_pos <= q_pos
    return ok if window is None else ok & (q_pos - k_pos < window)


def online_softmax_update(carry, s, ok, v):
    """Fold one block of keys into the running (row max m [..., r], normaliser den [..., r], output acc [..., r, d]):
    scores s [..., r, c] (MASKED where not `ok`), values v [..., c, d] (batch axes broadcast). The output is
    acc / den once every block is in."""
    m, den, acc = carry
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
    corr = jnp.exp(m - m_new)
    return m_new, den * corr + p.sum(-1), acc * corr[..., None] + jnp.matmul(p, v.astype(acc.dtype))
