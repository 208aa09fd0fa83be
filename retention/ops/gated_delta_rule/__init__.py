"""The gated delta rule (Gated DeltaNet): the op and its decode step (op.py), the chunked form by the WY/UT
representation (chunked.py) and the token recurrence that is its oracle (reference.py)."""

from retention.ops.gated_delta_rule.op import gated_delta_rule, gated_delta_rule_step
from retention.ops.gated_delta_rule.reference import gated_delta_rule_recurrence

__all__ = ["gated_delta_rule", "gated_delta_rule_recurrence", "gated_delta_rule_step"]
