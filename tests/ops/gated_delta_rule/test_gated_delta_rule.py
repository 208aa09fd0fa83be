"""The gated delta rule on its case table (tests/ops/matrix_state_cases.py): the chunked op (WY/UT) and the decode
step against the float64 recurrence, and the recurrence against the product of its matrices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention.ops.gated_delta_rule import gated_delta_rule_recurrence
from tests.ops.cases import _random_docs
from tests.ops.matrix_state_cases import Case, check_chunked, check_steps, params
from tests.ops.matrix_state_ops import GATED_DELTA_RULE

CASES = [
    Case(1, 2, 2, 8, 8, None, 16),  # one token, no decay (the plain delta rule)
    Case(37, 4, 2, 16, 8, "weak", 16, init=True, beta="high"),  # GQA, odd T over 3 chunks, from a state
    Case(100, 2, 2, 8, 16, "strong", 32, init=True, beta="low"),
    Case(100, 2, 1, 16, 8, "weak", 32, beta="high"),  # beta near 1 over long documents: the solve's worst case
    Case(48, 2, 1, 8, 8, "weak", 16, init=True, beta="high", docs=((1, 15, 20, 12), _random_docs(48, 7))),
]


@pytest.mark.parametrize("case", params(CASES))
def test_chunked(case):
    check_chunked(GATED_DELTA_RULE, case)


@pytest.mark.parametrize("case", params(CASES))
def test_steps(case):
    check_steps(GATED_DELTA_RULE, case)


def test_recurrence_is_the_product_of_its_matrices():
    """S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T with the matrices formed in numpy float64
    (T = 6, GQA), o_t = scale S_t^T q_t."""
    rng = np.random.default_rng(13)
    B, T, Hq, H, d_k, d_v = 2, 6, 4, 2, 5, 3
    q, k = rng.standard_normal((B, T, Hq, d_k)), rng.standard_normal((B, T, H, d_k))
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    v, beta, log_g = rng.standard_normal((B, T, H, d_v)), rng.uniform(0, 1, (B, T, H)), rng.uniform(-2, 0, (B, T, H))
    S = rng.standard_normal((B, H, d_k, d_v))
    want = np.zeros((B, T, Hq, d_v))
    S0 = S.copy()
    for t in range(T):
        for b, h in np.ndindex(B, H):
            kk = np.outer(k[b, t, h], k[b, t, h])
            S[b, h] = np.exp(log_g[b, t, h]) * (np.eye(d_k) - beta[b, t, h] * kk) @ S[b, h]
            S[b, h] += beta[b, t, h] * np.outer(k[b, t, h], v[b, t, h])
        for b, hq in np.ndindex(B, Hq):
            want[b, t, hq] = 0.5 * S[b, hq // (Hq // H)].T @ q[b, t, hq]
    got, S_got = jax.jit(gated_delta_rule_recurrence, static_argnames="scale")(
        *(jnp.asarray(x) for x in (q, k, v, beta, log_g, S0)), scale=0.5
    )
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(S_got), S, rtol=1e-12, atol=1e-12)
