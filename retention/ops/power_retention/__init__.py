"""Power retention: the op, its decode step, its oracles and its context-parallel form.

state.py: RetentionState and its helpers; sympow.py: the feature map phi; gates.py: the gates and resets as
per-chunk F and R; chunk_math.py: the per-chunk arithmetic the XLA paths share (the decay masks are
`retention/ops/decay.py`'s); chunked.py: the chunked form (training, prefill); recurrent.py: the decode step;
reference.py: the quadratic oracle and the token-by-token recurrence; expanded_state.py and pallas.py: the glue to
the Pallas kernels (`pallas_kernels.power_retention`); op.py: the public ops and their dispatch (validation.py:
their checks); context_parallel.py: the sequence split over a mesh axis. The chunk sizes are
`retention/ops/chunking.py`'s, shared with the matrix-state ops.
"""

from retention.ops.power_retention.context_parallel import power_retention_context_parallel
from retention.ops.power_retention.op import power_retention, power_retention_step
from retention.ops.power_retention.reference import power_retention_recurrence, power_retention_reference
from retention.ops.power_retention.state import RetentionState, init_state
from retention.ops.power_retention.sympow import sympow, sympow_dim
from retention.ops.power_retention.validation import RETENTION_IMPLS, STATE_IMPLS, check_deg

__all__ = [
    "RETENTION_IMPLS",
    "STATE_IMPLS",
    "RetentionState",
    "check_deg",
    "init_state",
    "power_retention",
    "power_retention_context_parallel",
    "power_retention_recurrence",
    "power_retention_reference",
    "power_retention_step",
    "sympow",
    "sympow_dim",
]
