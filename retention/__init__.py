"""retention: power retention, a linear attention with a fixed-size state, and softmax baselines, in JAX."""

from retention.generate import generate
from retention.nn import (
    LM,
    Attention,
    LMCache,
    LMConfig,
    PowerRetention,
    cache_bytes,
    count_params,
    flops_per_token,
    size_config,
)
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
from retention.run import load_run

__all__ = [
    "LM",
    "Attention",
    "KVCache",
    "LMCache",
    "LMConfig",
    "PowerRetention",
    "RetentionState",
    "cache_bytes",
    "count_params",
    "flops_per_token",
    "generate",
    "init_kv_cache",
    "init_state",
    "load_run",
    "power_retention",
    "power_retention_reference",
    "power_retention_step",
    "size_config",
    "softmax_attention",
    "softmax_attention_step",
    "sympow",
    "sympow_dim",
]
