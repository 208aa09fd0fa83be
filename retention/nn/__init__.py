"""Flax NNX modules on top of retention.ops: the sequence mixers and the language model."""

from retention.nn.mixers import Attention, PowerRetention, RetentionCache, cache_bytes
from retention.nn.model import LM, LMCache, LMConfig, count_params, flops_per_token, size_config

__all__ = [
    "LM",
    "Attention",
    "LMCache",
    "LMConfig",
    "PowerRetention",
    "RetentionCache",
    "cache_bytes",
    "count_params",
    "flops_per_token",
    "size_config",
]
