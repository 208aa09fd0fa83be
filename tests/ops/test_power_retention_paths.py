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

import pytest

from retention import init_state, power_retention, power_retention_step
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
