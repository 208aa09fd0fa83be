"""The XLA paths of power retention on the case table (tests/ops/cases.py): outputs, final states and gradients
against the float64 oracles, packed cases included (against each document run alone).

- xla: `power_retention(impl="xla")` over the whole sequence (the chunked form), every case;
- step: `power_retention_step(impl="xla")` fed all but the last 3 tokens (the chunked op from the state when that
  is more than the chunk size, else one chunk against it), then 3 (one chunk against the state), every case;
- scan: the token-by-token recurrence in float32, every case but degree 4 with strong gates or short documents:
  the state form sums D signed feature products to get (q.k)^p, and in float32 it loses digits when a row's
  weight is dominated by a few recent keys with small q.k (strong gates make the previous token dominate, as do
  documents of one or two tokens, and a token scan reads those keys through the state; measured dq 3.8e-5 on
  the degree-4 packed case). The chunked paths read recent keys directly.
"""

import jax
import jax.numpy as jnp
import pytest

from retention import init_kv_cache, init_state, power_retention, power_retention_step, softmax_attention_step
from retention.ops.power_retention import op as op_module
from retention.ops.power_retention.reference import power_retention_recurrence
from tests.ops.cases import case_ids, check_path, stepped


@pytest.mark.parametrize("case", case_ids(packed=True))
def test_chunked(case):
    def path(q, k, v, log_g, state0, segment_ids=None):
        options = dict(deg=case.deg, chunk_size=case.chunk, initial_state=state0, return_state=True, impl="xla")
        return power_retention(q, k, v, log_g, segment_ids=segment_ids, **options)

    check_path(case, path)


@pytest.mark.parametrize("case", case_ids(packed=True))
def test_step_op(case):
    step = lambda state, *x, **s: power_retention_step(state, *x, **s, deg=case.deg, chunk_size=case.chunk, impl="xla")
    check_path(case, stepped(step, lambda q, k: init_state(case.B, case.H, case.d, case.deg)))


@pytest.mark.parametrize("case", case_ids(lambda c: not (c.deg == 4 and (c.gate == "strong" or c.docs)), packed=True))
def test_token_scan(case):
    def path(q, k, v, log_g, state0, segment_ids=None):
        return power_retention_recurrence(q, k, v, log_g, state0, segment_ids=segment_ids, deg=case.deg)

    check_path(case, path)


@pytest.mark.parametrize("case", case_ids(lambda case: case.docs is not None and case.init, packed=True))
def test_step_op_in_pieces(case, monkeypatch):
    """A step longer than STEP_PIECE runs the chunked op a piece at a time from the state: with pieces of 16 the
    69-token step is 4 pieces and a rest, a document starting exactly on a piece (token 16) and one spanning two;
    outputs, states and gradients still match the oracles."""
    monkeypatch.setattr(op_module, "STEP_PIECE", 16)
    step = lambda state, *x, **s: power_retention_step(state, *x, **s, deg=case.deg, chunk_size=case.chunk, impl="xla")
    check_path(case, stepped(step, lambda q, k: init_state(case.B, case.H, case.d, case.deg)))


@pytest.mark.parametrize("op", ["power_retention_step", "softmax_attention_step"])
def test_a_65536_token_step_fits_in_1_gib_of_temporaries(op):
    """XLA's memory analysis of the compiled step (compiled, not run): 65536 new tokens (a state; a 65536-slot KV
    cache), GQA 4/2 heads of 64. Was 64 GiB for power retention (quadratic in n) and 34 GB for softmax (n * (L + n)
    scores); measured 0.14 GiB and 0.32 GiB."""
    n, B, Hq, H, d = 65536, 1, 4, 2, 64
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    if op == "power_retention_step":
        fn, state = power_retention_step, jax.eval_shape(lambda: init_state(B, H, d))
    else:
        fn, state = softmax_attention_step, jax.eval_shape(lambda: init_kv_cache(B, H, d, n))
    compiled = jax.jit(fn).lower(state, spec(B, n, Hq, d), spec(B, n, H, d), spec(B, n, H, d)).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < 2**30
