"""Softmax attention baselines with the [B, T, H, d] interface: causal (full or sliding window), decode against a
KV cache, and context parallelism.

scores.py: the mask, the accumulation dtype and the online-softmax block update every path shares;
blockwise.py: the blockwise kernel (forward and FlashAttention-2 backward); reference.py: dense, the oracle;
op.py: the public op and its dispatch (validation.py: its checks); decode.py: the KV cache and the decode step;
context_parallel.py: the sequence split over a mesh axis, K and V gathered.
"""

from retention.ops.attention.context_parallel import softmax_attention_context_parallel
from retention.ops.attention.decode import KVCache, init_kv_cache, softmax_attention_step
from retention.ops.attention.op import softmax_attention
from retention.ops.attention.validation import ATTENTION_IMPLS, check_window

__all__ = [
    "ATTENTION_IMPLS",
    "KVCache",
    "check_window",
    "init_kv_cache",
    "softmax_attention",
    "softmax_attention_context_parallel",
    "softmax_attention_step",
]
