"""The gated delta rule (Gated DeltaNet): the op and its decode step (op.py), the chunked form by the WY/UT
representation (chunked.py), the token recurrence that is its oracle (reference.py) and its form under a mesh that
splits the sequence (context_parallel.py)."""

from retention.ops.gated_delta_rule.context_parallel import gated_delta_rule_context_parallel
from retention.ops.gated_delta_rule.op import gated_delta_rule, gated_delta_rule_step
from retention.ops.gated_delta_rule.reference import gated_delta_rule_recurrence

__all__ = [
    "gated_delta_rule",
    "gated_delta_rule_context_parallel",
    "gated_delta_rule_recurrence",
    "gated_delta_rule_step",
]
