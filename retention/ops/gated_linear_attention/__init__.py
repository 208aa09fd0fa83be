"""Gated linear attention (a decay per key channel): the op and its decode step (op.py), the chunked form with
secondary chunking in log space (chunked.py), the token recurrence that is its oracle (reference.py) and its form
under a mesh that splits the sequence (context_parallel.py)."""

from retention.ops.gated_linear_attention.context_parallel import gated_linear_attention_context_parallel
from retention.ops.gated_linear_attention.op import gated_linear_attention, gated_linear_attention_step
from retention.ops.gated_linear_attention.reference import gated_linear_attention_recurrence

__all__ = [
    "gated_linear_attention",
    "gated_linear_attention_context_parallel",
    "gated_linear_attention_recurrence",
    "gated_linear_attention_step",
]
