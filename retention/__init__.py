"""retention: power retention, a linear attention with a fixed-size state, and softmax baselines, in JAX."""

from retention.ops import (
    KVCache,
    RetentionState,
    init_kv_cache,
    init_state,
    power_retention,
    power_retention_reference,
    power_retention_step,
    softmax_attention,
    softmax_attention_step,
    sympow,
    sympow_dim,
)

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
