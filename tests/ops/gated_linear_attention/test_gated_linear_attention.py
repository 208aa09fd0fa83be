"""Gated linear attention (a decay per key channel) on its case table (tests/ops/matrix_state_cases.py): the chunked
op and the decode step against the float64 recurrence, and the recurrence against the direct sum."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention.ops.gated_linear_attention import gated_linear_attention_recurrence
from tests.ops.cases import _random_docs
from tests.ops.matrix_state_cases import Case, check_chunked, check_steps, params
from tests.ops.matrix_state_ops import GLA

CASES = [
    Case(1, 2, 2, 8, 8, "weak", 16),  # one token
    Case(37, 4, 2, 16, 8, "weak", 16, init=True),  # GQA, odd T over 3 chunks, from a state, d_v != d_k
    Case(100, 2, 2, 8, 16, "strong", 32, init=True),  # two sub-chunks per chunk: the split factors
    Case(48, 2, 1, 8, 8, "strong", 32, init=True, docs=((1, 15, 20, 12), _random_docs(48, 6))),  # packed
]


@pytest.mark.parametrize("case", params(CASES))
def test_chunked(case):
    check_chunked(GLA, case)


@pytest.mark.parametrize("case", params(CASES))
def test_steps(case):
    check_steps(GLA, case)


def test_recurrence_is_the_direct_sum():
    """o_i = scale (sum_m q_im exp(G_im) S0_m + sum_{j <= i} sum_m q_im k_jm exp(G_im - G_jm) v_j), G the
    cumulative log-gates per channel, in numpy float64 at T = 6 with GQA."""
    rng = np.random.default_rng(12)
    B, T, Hq, H, d_k, d_v = 2, 6, 4, 2, 5, 3
    q, k = rng.standard_normal((B, T, Hq, d_k)), rng.standard_normal((B, T, H, d_k))
    v, log_g = rng.standard_normal((B, T, H, d_v)), rng.uniform(-2, 0, (B, T, H, d_k))
    S0 = rng.standard_normal((B, H, d_k, d_v))
    G = np.cumsum(log_g, axis=1)
    want = np.zeros((B, T, Hq, d_v))
    for b, i, hq in np.ndindex(B, T, Hq):
        h = hq // (Hq // H)
        want[b, i, hq] = (q[b, i, hq] * np.exp(G[b, i, h])) @ S0[b, h]
        for j in range(i + 1):
            want[b, i, hq] += np.sum(q[b, i, hq] * k[b, j, h] * np.exp(G[b, i, h] - G[b, j, h])) * v[b, j, h]
    got, _ = jax.jit(gated_linear_attention_recurrence, static_argnames="scale")(
        *(jnp.asarray(x) for x in (q, k, v, log_g, S0)), scale=1.0
    )
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
