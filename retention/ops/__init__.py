"""Pure functions on arrays: power retention (chunked, recurrent, reference), softmax baselines, the feature map."""

from retention.ops.attention import KVCache, init_kv_cache, softmax_attention, softmax_attention_step
from retention.ops.power_retention import power_retention, power_retention_step
from retention.ops.recurrent import RetentionState, init_state
from retention.ops.reference import power_retention_reference
from retention.ops.sympow import sympow, sympow_dim

__all__ = [
    "KVCache",
    "RetentionState",
    "init_kv_cache",
    "init_state",
    "power_retention",
    "power_retention_reference",
    "power_retention_step",
    "softmax_attention",
    "softmax_attention_step",
    "sympow",
    "sympow_dim",
]
