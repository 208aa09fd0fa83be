"""One meaning of segment ids on every path (retention/ops/segments.py): a change of id starts a fresh document, so
an id that comes back (under jit, where it cannot be refused, or in a later decode call) starts a new document that
sees nothing of its earlier run. Each path with such ids equals the same path with the ids renumbered 0, 1, 2, ...
(the contiguous case, checked against each document alone elsewhere)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention import (
    init_kv_cache,
    init_state,
    power_retention,
    power_retention_step,
    softmax_attention,
    softmax_attention_step,
)
from retention.ops.power_retention.state import clear_rows
from tests.helpers import random_qkv, rel_err

T = 23
RUNS = [(0, 6), (6, 9), (9, 17), (17, 18), (18, T)]  # five documents
RETURNING = np.array([3, 8, 3, 8, 3])  # ids that come back
_ids = lambda per_run: jnp.asarray(
    np.concatenate([np.full(b - a, i) for (a, b), i in zip(RUNS, per_run)])[None].repeat(2, 0), jnp.int32
)
SEG_RETURNING, SEG_NUMBERED = _ids(RETURNING), _ids(np.arange(5))

FULL_PATHS = {
    "softmax-xla": lambda q, k, v, g, seg: softmax_attention(q, k, v, segment_ids=seg),
    "softmax-reference": lambda q, k, v, g, seg: softmax_attention(q, k, v, segment_ids=seg, impl="reference"),
    "softmax-window": lambda q, k, v, g, seg: softmax_attention(q, k, v, window=5, segment_ids=seg),
    "retention-xla": lambda q, k, v, g, seg: power_retention(q, k, v, g, segment_ids=seg, chunk_size=16),
    "retention-reference": lambda q, k, v, g, seg: power_retention(q, k, v, g, segment_ids=seg, impl="reference"),
    "retention-step": lambda q, k, v, g, seg: power_retention_step(init_state(2, 2, 8), q, k, v, g, segment_ids=seg)[0],
}


@pytest.mark.parametrize("path", FULL_PATHS)
def test_an_id_that_comes_back_under_jit_starts_a_new_document(path):
    """Attention rejoined the earlier run of a returning id (1.9 off) while retention started afresh."""
    q, k, v, g = random_qkv(5, 2, T, 4, 2, 8, gate="mild")
    run = jax.jit(FULL_PATHS[path])
    got, want = run(q, k, v, g, SEG_RETURNING), run(q, k, v, g, SEG_NUMBERED)
    assert rel_err(got, want) < 1e-6


_attention_step = jax.jit(
    lambda c, q, k, v, seg, window: softmax_attention_step(c, q, k, v, window=window, segment_ids=seg),
    static_argnames="window",
)
_retention_step = jax.jit(lambda state, q, k, v, g, seg: power_retention_step(state, q, k, v, g, segment_ids=seg))


def _decoded(kind, q, k, v, g, seg, cuts):
    """The spans between `cuts` fed in turn to the step of `kind`: "full" or "window" (a KV cache; a ring buffer of
    window + longest span - 1 slots), or "retention" (a state, cleared for a row whose span starts a document, as
    the PowerRetention mixer does). Returns y [B, T, Hq, d]."""
    window = 5 if kind == "window" else None
    spans = list(zip(cuts[:-1], cuts[1:]))
    slots = T if window is None else window + max(b - a for a, b in spans) - 1
    state = init_state(2, 2, 8) if kind == "retention" else init_kv_cache(2, 2, 8, slots)
    ys = []
    for a, b in spans:
        if kind == "retention":
            if a > 0:
                state = clear_rows(state, seg[:, a] != seg[:, a - 1])
            y, state = _retention_step(state, q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], seg[:, a:b])
        else:
            y, state = _attention_step(state, q[:, a:b], k[:, a:b], v[:, a:b], seg[:, a:b], window)
        ys.append(y)
    return jnp.concatenate(ys, axis=1)


@pytest.mark.parametrize("kind", ["full", "window", "retention"])
@pytest.mark.parametrize("cuts", [(0, 7, 12, 17, 18, 20, T), pytest.param((0, 9, T), marks=pytest.mark.slow)])
def test_an_id_that_comes_back_in_a_later_step_starts_a_new_document(kind, cuts):
    """Decode steps (of one or several tokens) whose ids return to an id the cache holds from before another one:
    the same as the renumbered ids and as the full op on them, for the KV cache (full, and a ring buffer of a
    window) and the retention state (attention rejoined the earlier run)."""
    q, k, v, g = random_qkv(6, 2, T, 4, 2, 8, gate="mild")
    got = _decoded(kind, q, k, v, g, SEG_RETURNING, cuts)
    full = jax.jit(FULL_PATHS[{"full": "softmax-xla", "window": "softmax-window", "retention": "retention-xla"}[kind]])
    assert rel_err(got, _decoded(kind, q, k, v, g, SEG_NUMBERED, cuts)) < 1e-6
    assert rel_err(got, full(q, k, v, g, SEG_NUMBERED)) < 1e-5
