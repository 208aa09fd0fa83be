"""Softmax attention baselines with the [B, T, H, d] interface: causal (full or sliding window), decode against a
KV cache, and context parallelism.

scores.py: the mask, the accumulation dtype and the online-softmax block update every path shares;
blockwise.py: the blockwise kernel (forward and FlashAttention-2 backward); reference.py: dense, the oracle;
op.py: the public op and its dispatch (validation.py: its checks); decode.py: the KV cache and the decode step;
quantized.py: the int8 / 4-bit KV cache (a bfloat16 scale per group of values) and its decode step;
context_parallel.py: the sequence split over a mesh axis, K and V gathered.
"""

from retention.ops.attention.context_parallel import softmax_attention_context_parallel
from retention.ops.attention.decode import KVCache, fill_kv_cache, init_kv_cache, softmax_attention_step
from retention.ops.attention.op import softmax_attention
from retention.ops.attention.quantized import (
    KV_CACHE_BITS,
    QuantizedKVCache,
    fill_quantized_kv_cache,
    init_quantized_kv_cache,
    softmax_attention_step_quantized,
)
from retention.ops.attention.validation import ATTENTION_IMPLS, check_window

__all__ = [
    "ATTENTION_IMPLS",
    "KV_CACHE_BITS",
    "KVCache",
    "QuantizedKVCache",
    "check_window",
    "fill_kv_cache",
    "fill_quantized_kv_cache",
    "init_kv_cache",
    "init_quantized_kv_cache",
    "softmax_attention",
    "softmax_attention_context_parallel",
    "softmax_attention_step",
    "softmax_attention_step_quantized",
]
