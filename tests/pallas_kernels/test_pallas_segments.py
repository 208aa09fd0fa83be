"""Resets in the kernels (the reset contract: segment ids and -inf gates, `pallas.kernel_gates`), interpret mode.

- Packed against separate: a batch of packed documents (boundaries inside chunks and on one) gives, per document,
  the rows and the gradients (q, k, v, log_g, the initial state) of running that document alone, and the final
  state of the last one. Oracle: the float64 token-by-token recurrence on each document alone (the first from the
  initial state, every other from empty).
- -inf gates reset one kv-head: against the recurrence with that gate at -1000 (exp(-1000) is exactly 0 in
  float64), outputs and gradients, all finite.
- Non-finite inputs: a NaN in v, k or a gate, or a positive gate, gives NaN in its own document from that token on
  (a NaN in v only in its own column) and leaves every earlier row and every other document exactly as before.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention import RetentionState, init_state
from retention.ops.power_retention.pallas import chunked_pallas, kernel_gates
from retention.ops.power_retention.reference import power_retention_recurrence
from tests.helpers import f64, random_qkv, rel_err

TOL = 2e-5
B, T, Hq, H, d, CHUNK = 2, 70, 4, 2, 16, 16
DOCS = ([0, 13, 32, 59], [0, 40])  # document starts per row: inside chunks, and one on a chunk boundary (32)


def _segment_ids():
    ids = np.zeros((B, T), np.int32)
    for b, starts in enumerate(DOCS):
        for i, s in enumerate(starts):
            ids[b, s:] = 7 * i + 3  # ids need not be contiguous in value
    return jnp.asarray(ids)


def _inputs(seed):
    q, k, v, log_g = random_qkv(seed, B, T, Hq, H, d, gate="mild")
    pq, pk, pv, pg = random_qkv(seed + 1, B, 9, Hq, H, d, gate="mild")
    _, state0 = power_retention_recurrence(pq, pk, pv, pg, init_state(B, H, d), deg=2)
    return q, k, v, log_g, state0


def _kernels(q, k, v, log_g, state0, segment_ids):
    return chunked_pallas(q, k, v, log_g, state0, deg=2, scale=d**-0.5, chunk_size=CHUNK, segment_ids=segment_ids)


@jax.jit
def _kernel_forward(q, k, v, log_g, S0, z0, segment_ids):
    return _kernels(q, k, v, log_g, RetentionState(S0, z0), segment_ids)[0]


@jax.jit
def _kernel_grads(q, k, v, log_g, S0, z0, segment_ids, ct_y, ct_S):
    def loss(q, k, v, log_g, S0, z0):
        y, state = _kernels(q, k, v, log_g, RetentionState(S0, z0), segment_ids)
        return jnp.sum(y * ct_y) + jnp.sum(state.S * ct_S), y

    return jax.value_and_grad(loss, argnums=tuple(range(6)), has_aux=True)(q, k, v, log_g, S0, z0)


def _oracle_grads(q, k, v, log_g, state0, ct_y, ct_S, last):
    """The float64 recurrence on each batch row: (y, gradients in (q, k, v, log_g, S0, z0)); the state's cotangent
    counts only for the rows where `last` [rows] is true."""

    def loss(q, k, v, log_g, S0, z0):
        y, state = power_retention_recurrence(q, k, v, log_g, RetentionState(S0, z0), deg=2)
        return jnp.sum(y * ct_y) + jnp.sum(state.S * ct_S * jnp.asarray(last)[:, None, None, None]), y

    return jax.value_and_grad(loss, argnums=tuple(range(6)), has_aux=True)(*f64(q, k, v, log_g, *state0))


def _documents_as_rows(x_BT, L: int):
    """Each document of DOCS as its own row [R, L, ...], zero-padded at its end (zero keys, values and log-gates
    change neither a document's rows nor its final state), in DOCS order."""
    rows = []
    for b, starts in enumerate(DOCS):
        for lo, hi in zip(starts, starts[1:] + [T]):
            pad = [(0, L - (hi - lo))] + [(0, 0)] * (x_BT.ndim - 2)
            rows.append(jnp.pad(x_BT[b, lo:hi], pad))
    return jnp.stack(rows)


def _cotangents(seed):
    ka, kb = jax.random.split(jax.random.key(seed))
    return jax.random.normal(ka, (B, T, Hq, d)), jax.random.normal(kb, init_state(B, H, d).S.shape)


def test_packed_documents_equal_each_document_alone():
    q, k, v, log_g, state0 = _inputs(0)
    ct_y, ct_S = _cotangents(1)
    (_, y), grads = _kernel_grads(q, k, v, log_g, *state0, _segment_ids(), ct_y, ct_S)
    spans = [(b, i, lo, hi) for b, s in enumerate(DOCS) for i, (lo, hi) in enumerate(zip(s, s[1:] + [T]))]
    L = max(hi - lo for *_, lo, hi in spans)
    first = [i == 0 for _, i, *_ in spans]
    last = [i == len(DOCS[b]) - 1 for b, i, *_ in spans]
    rows_of = [b for b, *_ in spans]
    first_doc = lambda x: jnp.asarray(first).reshape((-1,) + (1,) * (x.ndim - 1))
    start = jax.tree.map(lambda x: jnp.where(first_doc(x), x[jnp.asarray(rows_of)], 0), state0)
    rows = [_documents_as_rows(x, L) for x in (q, k, v, log_g, ct_y)]
    (_, y_doc), g_doc = _oracle_grads(*rows[:4], start, rows[4], ct_S[jnp.asarray(rows_of)], last)
    for r, (b, i, lo, hi) in enumerate(spans):
        where = f"row {b} document {i}"
        assert rel_err(y[b : b + 1, lo:hi], y_doc[r : r + 1, : hi - lo]) < TOL, where
        for name, g, want in zip(("q", "k", "v", "log_g"), grads[:4], g_doc[:4]):
            assert rel_err(g[b : b + 1, lo:hi], want[r : r + 1, : hi - lo]) < TOL, f"d{name} {where}"
        if i == 0:  # only the first document reads the initial state
            for name, g, want in zip(("S0", "z0"), grads[4:], g_doc[4:]):
                assert rel_err(g[b : b + 1], want[r : r + 1]) < TOL, f"d{name} {where}"


def test_neg_inf_gates_reset_their_head():
    q, k, v, log_g, state0 = _inputs(2)
    resets = np.zeros((B, T, H), bool)
    resets[0, [0, 21, 48], 0] = True  # head 0 of row 0, at the first token too (drops the initial state)
    resets[1, [16, 33], 1] = True  # on and after a chunk boundary
    gated = jnp.where(resets, -jnp.inf, log_g)
    ct_y, ct_S = _cotangents(3)
    no_segments = jnp.zeros((B, T), jnp.int32)
    (_, y), grads = _kernel_grads(q, k, v, gated, *state0, no_segments, ct_y, ct_S)
    (_, y_want), g_want = _oracle_grads(q, k, v, jnp.where(resets, -1000.0, log_g), state0, ct_y, ct_S, [True] * B)
    assert rel_err(y, y_want) < TOL
    for name, g, want in zip(("q", "k", "v", "log_g", "S0", "z0"), grads, g_want):
        assert np.all(np.isfinite(np.asarray(g))), name
        assert rel_err(g, want) < TOL, "d" + name


@pytest.mark.parametrize(
    "what,row,token,head",
    [("v", 0, 20, 1), ("k", 0, 37, 0), ("log_g", 1, 5, 1), ("positive gate", 0, 45, 0)],
)
def test_non_finite_stays_in_its_document(what, row, token, head):
    q, k, v, log_g, state0 = _inputs(4)
    run = lambda *a: _kernel_forward(*a, *state0, _segment_ids())
    clean = np.asarray(run(q, k, v, log_g))
    if what in ("v", "k"):
        x = {"v": v, "k": k}[what].at[row, token, head, 3].set(jnp.nan)
        q2, k2, v2, g2 = (q, x, v, log_g) if what == "k" else (q, k, x, log_g)
    else:
        g2 = log_g.at[row, token, head].set(jnp.nan if what == "log_g" else 0.5)
        q2, k2, v2 = q, k, v
    y = np.asarray(run(q2, k2, v2, g2))
    starts = DOCS[row] + [T]
    end = next(s for s in starts if s > token)
    heads = slice(head * (Hq // H), (head + 1) * (Hq // H))  # the query heads that read this kv-head
    hit = y[row, token:end, heads]
    assert np.all(np.isnan(hit))  # a non-finite k or v poisons its token whole (gates.py), as on the XLA paths
    untouched = np.ones(y.shape, bool)
    untouched[row, token:end, heads] = False
    np.testing.assert_array_equal(y[untouched], clean[untouched])


def test_kernel_gates_follow_the_contract():
    """R counts the resets (segment starts after token 0, -inf gates) per chunk; F agrees with the gates wherever
    the kernels read it: F_i - F_j is the sum of log_g over (j, i] within one document, F_i the sum from the
    chunk's start while no reset precedes i; k and v of a non-finite token are zeroed and its document's F NaN."""
    log_g = jnp.asarray([[[-0.5], [-jnp.inf], [-0.25], [-1.0], [-0.5]]], jnp.float32)  # [1, 5, 1]
    ids = jnp.asarray([[4, 4, 4, 9, 9]], jnp.int32)
    kv = jax.random.normal(jax.random.key(3), (1, 5, 1, 2))
    _, _, F, R = kernel_gates(kv, kv, log_g, ids, 4)
    np.testing.assert_array_equal(np.asarray(R)[0, :, 0], [0, 1, 1, 2, 0])  # the 5th token starts chunk 2
    F = np.asarray(F)[0, :, 0]
    assert F[0] == -0.5 and F[4] == -0.5  # no reset before them in their chunk
    assert F[2] - F[1] == -0.25  # within the document that the -inf gate starts
    bad = kv.at[0, 2, 0, 1].set(jnp.inf)
    k, v, F, _ = kernel_gates(bad, kv, log_g, ids, 4)
    assert np.all(np.asarray(k)[0, 2] == 0) and np.all(np.asarray(v)[0, 2] == 0)
    F = np.asarray(F)[0, :, 0]
    assert np.isnan(F[2]) and not np.isnan(F[[0, 1, 3, 4]]).any()  # the inf token poisons its own document only
    _, _, F, R = kernel_gates(kv, kv, None, ids, 8)
    np.testing.assert_array_equal(np.asarray(R)[0, :, 0], [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(np.asarray(F)[0, :, 0], [0, 0, 0, 0, 0])
