"""Linear attention with a scalar decay on its case table (tests/ops/matrix_state_cases.py): the chunked op and the
decode step against the float64 recurrence, and the recurrence against the masked quadratic form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention.ops.linear_attention import linear_attention_recurrence
from tests.ops.cases import _random_docs
from tests.ops.matrix_state_cases import Case, check_chunked, check_steps, params
from tests.ops.matrix_state_ops import LINEAR_ATTENTION

CASES = [
    Case(1, 2, 2, 8, 8, None, 16),  # one token, no decay
    Case(37, 4, 2, 16, 8, "weak", 16, init=True),  # GQA, odd T over 3 chunks, from a state, d_v != d_k
    Case(100, 2, 2, 8, 16, "strong", 32, init=True),
    Case(48, 2, 1, 8, 8, "weak", 16, init=True, docs=((1, 15, 20, 12), _random_docs(48, 5))),  # packed
]


@pytest.mark.parametrize("case", params(CASES))
def test_chunked(case):
    check_chunked(LINEAR_ATTENTION, case)


@pytest.mark.parametrize("case", params(CASES))
def test_steps(case):
    check_steps(LINEAR_ATTENTION, case)


def test_recurrence_is_the_masked_quadratic_form():
    """o_i = scale (exp(G_i) S0^T q_i + sum_{j <= i} exp(G_i - G_j) (q_i . k_j) v_j), G the cumulative log-gates,
    in numpy float64 at T = 7 with GQA."""
    rng = np.random.default_rng(11)
    B, T, Hq, H, d_k, d_v = 2, 7, 4, 2, 5, 3
    q, k, v = (
        rng.standard_normal((B, T, Hq, d_k)),
        rng.standard_normal((B, T, H, d_k)),
        rng.standard_normal((B, T, H, d_v)),
    )
    log_g, S0 = rng.uniform(-2, 0, (B, T, H)), rng.standard_normal((B, H, d_k, d_v))
    scale = 0.7
    G = np.cumsum(log_g, axis=1)
    kv_of = np.arange(Hq) // (Hq // H)
    kq, vq, Gq, Sq = k[:, :, kv_of], v[:, :, kv_of], G[:, :, kv_of], S0[:, kv_of]
    scores = np.einsum("bihd,bjhd->bhij", q, kq) * np.exp(
        Gq.transpose(0, 2, 1)[..., :, None] - Gq.transpose(0, 2, 1)[..., None, :]
    )
    scores = scores * np.tril(np.ones((T, T)))
    want = scale * (
        np.einsum("bhij,bjhe->bihe", scores, vq) + np.exp(Gq)[..., None] * np.einsum("bihd,bhde->bihe", q, Sq)
    )
    got, _ = jax.jit(linear_attention_recurrence, static_argnames="scale")(
        *(jnp.asarray(x) for x in (q, k, v, log_g, S0)), scale=scale
    )
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
