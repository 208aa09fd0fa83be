"""Softmax baselines: blockwise (forward and custom backward) against dense, windows, and KV-cache decode."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention import init_kv_cache, softmax_attention, softmax_attention_step
from retention.ops.attention.blockwise import blockwise_attention
from retention.ops.attention.reference import dense_attention
from tests.helpers import f64, random_qkv, rel_err


@pytest.mark.parametrize(
    "T,Hq,H,window,block",
    [
        (1, 2, 1, None, 16),
        (63, 4, 2, None, 16),
        (200, 4, 1, None, 64),
        (200, 2, 2, 37, 32),
        (1000, 2, 2, 100, 128),
        (300, 4, 2, 1, 64),
        (130, 2, 1, 500, 32),
    ],
)
def test_blockwise_matches_dense(T, Hq, H, window, block):
    q, k, v, _ = random_qkv(T, 2, T, Hq, H, 16)
    cot = jax.random.normal(jax.random.key(1), q.shape, jnp.float64)
    blockwise = lambda *a: blockwise_attention(*a, window=window, scale=0.25, block_size=block)
    dense = lambda *a: dense_attention(*a, window=window, scale=0.25)
    loss = lambda fn: lambda *a: jnp.sum(fn(*a).astype(jnp.float64) * cot)
    assert rel_err(blockwise(q, k, v), dense(*f64(q, k, v))) < 1e-5
    got = jax.grad(loss(blockwise), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(dense), argnums=(0, 1, 2))(*f64(q, k, v))
    for name, a, b in zip("qkv", got, want):
        if name == "v" or (T > 1 and window != 1):
            assert rel_err(a, b) < 1e-5, name
        else:  # one visible key: the softmax is constant, so dq = dk = 0 up to rounding
            assert float(jnp.abs(a).max()) < 1e-6 * float(jnp.abs(got[2]).max()), name


def test_public_op_defaults_to_blockwise_on_cpu():
    q, k, v, _ = random_qkv(3, 1, 77, 4, 2, 8)
    assert rel_err(softmax_attention(q, k, v), dense_attention(*f64(q, k, v), scale=8**-0.5)) < 1e-5
    assert rel_err(softmax_attention(q, k, v, impl="reference"), dense_attention(*f64(q, k, v), scale=8**-0.5)) < 1e-6


@pytest.mark.parametrize("window,n,max_len", [(None, 1, 90), (None, 3, 90), (9, 1, 9), (9, 4, 12), (20, 2, 21)])
def test_step_matches_full(window, n, max_len):
    """Decode n tokens at a time against a preallocated cache (a ring buffer when max_len < T)."""
    T = 85
    q, k, v, _ = random_qkv(n, 2, T, 4, 2, 8)
    full = dense_attention(*f64(q, k, v), window=window, scale=8**-0.5)
    cache = init_kv_cache(2, 2, 8, max_len)
    step = jax.jit(lambda c, *a: softmax_attention_step(c, *a, window=window), donate_argnums=0)
    for t in range(0, T - n + 1, n):
        y, cache = step(cache, q[:, t : t + n], k[:, t : t + n], v[:, t : t + n])
        assert rel_err(y, full[:, t : t + n]) < 1e-5, t
    assert int(cache.length) == (T // n) * n


PACKED_T, SCALE = 72, 8**-0.5
PACKED_DOCS = ((1, 15, 20, 1, 1, 34), (5, 11, 16, 2, 29, 9))  # length-1 documents; starts on and across block 16


def _segments(docs):
    """Segment ids [B, T] of per-row document lengths (non-consecutive ids)."""
    return jnp.asarray([np.repeat(7 * np.arange(len(row)) + 3, row) for row in docs], jnp.int32)


def _documents_alone(q, k, v, window):
    """Dense attention on each document by itself (its own call), rows put back in place: [B, T, Hq, d]."""
    rows = []
    for b, row in enumerate(PACKED_DOCS):
        starts = np.cumsum((0,) + row)[:-1]
        doc = lambda x, s, n, b=b: x[b : b + 1, s : s + n]
        parts = [
            dense_attention(doc(q, s, n), doc(k, s, n), doc(v, s, n), window=window, scale=SCALE)
            for s, n in zip(starts, row)
        ]
        rows.append(jnp.concatenate(parts, axis=1))
    return jnp.concatenate(rows)


@functools.cache
def _packed_oracle(window):
    """(inputs q, k, v, cotangent, float64 y and gradients of <y, ct> of the documents run alone)."""
    q, k, v, _ = random_qkv(11, 2, PACKED_T, 4, 2, 8)
    ct = jax.random.normal(jax.random.key(12), q.shape, jnp.float32)
    alone = lambda *x: jnp.vdot(_documents_alone(*x, window), ct)
    y, grads = jax.jit(
        jax.value_and_grad(lambda *x: (alone(*x), _documents_alone(*x, window)), (0, 1, 2), has_aux=True)
    )(*f64(q, k, v))
    return (q, k, v, ct), y[1], grads


def _stepped(q, k, v, window, seg):
    """softmax_attention_step fed 24 tokens at a time with their segment ids (a 32-slot ring buffer for the
    window)."""
    cache = init_kv_cache(q.shape[0], k.shape[2], q.shape[3], PACKED_T if window is None else window + 23, q.dtype)
    ys = []
    for t in range(0, PACKED_T, 24):
        piece = lambda x, t=t: x[:, t : t + 24]
        y, cache = softmax_attention_step(cache, *map(piece, (q, k, v)), window=window, segment_ids=piece(seg))
        ys.append(y)
    return jnp.concatenate(ys, axis=1)


@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.parametrize("path", ["dense", "blockwise", "step"])
def test_packed_equals_the_documents_alone(path, window):
    """Packed rows with segment_ids: outputs and the gradients of <y, ct> with respect to q, k and v equal running
    each document alone (float64 dense attention), full attention and a sliding window, GQA."""
    (q, k, v, ct), y_want, grads_want = _packed_oracle(window)
    seg = _segments(PACKED_DOCS)
    run = {
        "dense": lambda q, k, v: dense_attention(q, k, v, window=window, segment_ids=seg, scale=SCALE),
        "blockwise": lambda q, k, v: blockwise_attention(
            q, k, v, window=window, segment_ids=seg, scale=SCALE, block_size=16
        ),
        "step": lambda q, k, v: _stepped(q, k, v, window, seg),
    }[path]
    loss = lambda fn: lambda *x: jnp.vdot(fn(*x).astype(jnp.float64), ct)
    with_y = lambda *x: (loss(run)(*x), run(*x))
    (_, y), grads = jax.jit(jax.value_and_grad(with_y, (0, 1, 2), has_aux=True))(q, k, v)
    assert rel_err(y, y_want) < 1e-5
    for name, a, b in zip("qkv", grads, grads_want):
        assert rel_err(a, b) < 1e-5, name
