"""Linear attention with a scalar decay: the op and its decode step (op.py), the chunked form (chunked.py), the
token recurrence that is its oracle (reference.py) and its form under a mesh that splits the sequence
(context_parallel.py)."""

from retention.ops.linear_attention.context_parallel import linear_attention_context_parallel
from retention.ops.linear_attention.op import linear_attention, linear_attention_step
from retention.ops.linear_attention.reference import linear_attention_recurrence

__all__ = [
    "linear_attention",
    "linear_attention_context_parallel",
    "linear_attention_recurrence",
    "linear_attention_step",
]
