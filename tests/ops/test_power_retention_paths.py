"""The XLA paths of power retention on the case table (tests/ops/cases.py): outputs, final states and gradients
against the float64 oracles.

- xla: `power_retention(impl="xla")` over the whole sequence (the chunked form), every case;
- step: `power_retention_step(impl="xla")` fed all but the last 3 tokens (the chunked op from the state when that
  is more than the chunk size, else one chunk against it), then 3 (one chunk against the state), every case;
- scan: the token-by-token recurrence in float32, every case but degree 4 with strong gates: the state form sums
  D signed feature products to get (q.k)^p, and in float32 it loses digits when a row's weight is dominated by a
  recent key with small q.k (strong gates make the previous token dominate, and a token scan reads that token
  through the state). The chunked paths read recent keys directly.
"""

import pytest

from retention import init_state, power_retention, power_retention_step
from retention.ops.power_retention.reference import power_retention_recurrence
from tests.ops.cases import case_ids, check_path, stepped


@pytest.mark.parametrize("case", case_ids())
def test_chunked(case):
    def path(q, k, v, log_g, state0):
        return power_retention(
            q, k, v, log_g, deg=case.deg, chunk_size=case.chunk, initial_state=state0, return_state=True, impl="xla"
        )

    check_path(case, path)


@pytest.mark.parametrize("case", case_ids())
def test_step_op(case):
    step = lambda state, *x: power_retention_step(state, *x, deg=case.deg, chunk_size=case.chunk, impl="xla")
    check_path(case, stepped(step, lambda q, k: init_state(case.B, case.H, case.d, case.deg)))


@pytest.mark.parametrize("case", case_ids(lambda case: not (case.deg == 4 and case.gate == "strong")))
def test_token_scan(case):
    check_path(case, lambda q, k, v, log_g, state0: power_retention_recurrence(q, k, v, log_g, state0, deg=case.deg))
