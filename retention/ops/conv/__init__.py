"""The causal depthwise short convolution over time (causal.py) and its form under a mesh that splits the
sequence (context_parallel.py)."""

from retention.ops.conv.causal import causal_conv
from retention.ops.conv.context_parallel import causal_conv_context_parallel

__all__ = ["causal_conv", "causal_conv_context_parallel"]
