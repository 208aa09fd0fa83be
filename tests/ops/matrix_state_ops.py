"""The three matrix-state ops as `matrix_state_cases.Op`s, for the case tables and the property tests."""

from retention import (
    gated_delta_rule,
    gated_delta_rule_step,
    gated_linear_attention,
    gated_linear_attention_step,
    linear_attention,
    linear_attention_step,
)
from retention.ops.gated_delta_rule import gated_delta_rule_recurrence
from retention.ops.gated_linear_attention import gated_linear_attention_recurrence
from retention.ops.linear_attention import linear_attention_recurrence
from tests.ops.matrix_state_cases import Op

LINEAR_ATTENTION = Op(
    "linear_attention", linear_attention, linear_attention_step, linear_attention_recurrence, "scalar"
)
GLA = Op(
    "gated_linear_attention",
    gated_linear_attention,
    gated_linear_attention_step,
    gated_linear_attention_recurrence,
    "channel",
)
GATED_DELTA_RULE = Op(
    "gated_delta_rule", gated_delta_rule, gated_delta_rule_step, gated_delta_rule_recurrence, "scalar", beta=True
)
OPS = {op.name: op for op in (LINEAR_ATTENTION, GLA, GATED_DELTA_RULE)}
