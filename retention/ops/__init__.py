"""Pure functions on arrays, one folder per op: power retention (`power_retention/`: chunked, recurrent, Pallas,
reference, context parallel), the softmax baselines (`attention/`), the field's matrix-state ops
(`linear_attention/`, `gated_linear_attention/`, `gated_delta_rule/`, sharing matrix_state.py) and the short
convolution (`conv/`). No op folder imports another's: what they share is the floor beside them, the decay and reset
arithmetic (decay.py), the chunk sizes (chunking.py), the checks (validation.py), the segment ids (segments.py),
the platform they target (platform.py) and the mesh helpers of their context-parallel forms (context_mesh.py)."""

from retention.ops.attention import (
    ATTENTION_IMPLS,
    KVCache,
    init_kv_cache,
    softmax_attention,
    softmax_attention_context_parallel,
    softmax_attention_step,
)
from retention.ops.chunking import CHUNK_SIZES
from retention.ops.context_mesh import context_parallel_size
from retention.ops.conv import causal_conv, causal_conv_context_parallel
from retention.ops.gated_delta_rule import (
    gated_delta_rule,
    gated_delta_rule_context_parallel,
    gated_delta_rule_step,
)
from retention.ops.gated_linear_attention import (
    gated_linear_attention,
    gated_linear_attention_context_parallel,
    gated_linear_attention_step,
)
from retention.ops.linear_attention import (
    linear_attention,
    linear_attention_context_parallel,
    linear_attention_step,
)
from retention.ops.matrix_state import init_matrix_state
from retention.ops.platform import lowering_for
from retention.ops.power_retention import (
    RETENTION_IMPLS,
    RetentionState,
    check_deg,
    init_state,
    power_retention,
    power_retention_context_parallel,
    power_retention_reference,
    power_retention_step,
    sympow,
    sympow_dim,
)
from retention.ops.validation import check_chunk_size

__all__ = [
    "ATTENTION_IMPLS",
    "CHUNK_SIZES",
    "RETENTION_IMPLS",
    "KVCache",
    "RetentionState",
    "causal_conv",
    "causal_conv_context_parallel",
    "check_chunk_size",
    "check_deg",
    "gated_delta_rule",
    "gated_delta_rule_context_parallel",
    "gated_delta_rule_step",
    "gated_linear_attention",
    "gated_linear_attention_context_parallel",
    "gated_linear_attention_step",
    "init_kv_cache",
    "init_matrix_state",
    "init_state",
    "linear_attention",
    "linear_attention_context_parallel",
    "linear_attention_step",
    "lowering_for",
    "power_retention",
    "power_retention_context_parallel",
    "power_retention_reference",
    "power_retention_step",
    "context_parallel_size",
    "softmax_attention",
    "softmax_attention_context_parallel",
    "softmax_attention_step",
    "sympow",
    "sympow_dim",
]
