"""Flax NNX modules on top of retention.ops: the sequence mixers (one module each, listed by layer letter in
registry.py), the language model (model.py), its config (config.py) and its sizes (sizing.py)."""

from retention.nn.attention import Attention, AttentionCache
from retention.nn.config import LMConfig
from retention.nn.convert import convert
from retention.nn.gated_deltanet import GatedDeltaNet
from retention.nn.gla import GatedLinearAttention
from retention.nn.mamba2 import Mamba2
from retention.nn.matrix_state import MatrixStateCache
from retention.nn.mixer_interface import Mixer
from retention.nn.mixer_kind import MixerKind
from retention.nn.model import LM, LMCache
from retention.nn.power_retention import PowerRetention, RetentionCache
from retention.nn.registry import MIXERS
from retention.nn.sizing import cache_bytes, count_params, decode_cache_bytes, flops_per_token, size_config

__all__ = [
    "LM",
    "MIXERS",
    "Mamba2",
    "Attention",
    "AttentionCache",
    "GatedDeltaNet",
    "GatedLinearAttention",
    "LMCache",
    "LMConfig",
    "MatrixStateCache",
    "Mixer",
    "MixerKind",
    "PowerRetention",
    "RetentionCache",
    "cache_bytes",
    "convert",
    "count_params",
    "decode_cache_bytes",
    "flops_per_token",
    "size_config",
]
