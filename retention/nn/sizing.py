"""Sizes of an LM from its config alone, read from the mixer registry's formulas: parameters, forward FLOPs per
token, decode-cache bytes, and the width that hits a parameter budget."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from retention.nn.config import LMConfig
from retention.nn.registry import MIXERS
from retention.validation import check_int


def cache_bytes(cache) -> int:
    """Total bytes of the arrays in a cache pytree.

    Args:
        cache (Any): a pytree of arrays or jax.ShapeDtypeStructs (e.g. from jax.eval_shape).

    Returns:
        The bytes.
    """
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(cache))


def _mlp_params(config: LMConfig) -> int:
    return 3 * config.d_model * config.mlp_hidden


def _matmul_params(config: LMConfig) -> int:
    """Weights that multiply activations, per token: mixer projections, MLPs and the head (tied or not)."""
    mixers = sum(MIXERS[kind].matmul_params(config.for_kind(kind)) for kind in config.layer_kinds)
    return mixers + config.n_layers * _mlp_params(config) + config.vocab_size * config.d_model


def count_params(config: LMConfig) -> int:
    """The parameter count of LM(config), from the config alone.

    Args:
        config: the model's config.

    Returns:
        The count; equals `LM.param_count()`.
    """
    D = config.d_model
    total = config.vocab_size * D * (1 if config.tie_embeddings else 2)
    total += ((2 if config.mlp_hidden else 1) * config.n_layers + 1) * D  # block norms (one without MLP), final norm
    total += config.n_layers * _mlp_params(config)
    return total + sum(MIXERS[kind].params(config.for_kind(kind)) for kind in config.layer_kinds)


def flops_per_token(config: LMConfig, T: int) -> float:
    """Forward FLOPs per token over a sequence of T tokens (DESIGN section 1): 2 per matmul weight, plus each
    layer's sequence mixing (its MixerKind's mixing_flops: scores or state, and the short convolution).

    Args:
        config: the model's config.
        T: the sequence length.

    Returns:
        FLOPs per token.
    """
    mixing = sum(MIXERS[kind].mixing_flops(config.for_kind(kind), T) for kind in config.layer_kinds)
    return 2 * _matmul_params(config) + mixing


def decode_cache_bytes(config: LMConfig, batch: int, max_len: int, *, step_tokens: int = 1) -> int:
    """Bytes of `LM(config).init_caches(batch, max_len, step_tokens=...)`, from the config alone: every layer's
    cache (its MixerKind's formula) plus the LMCache's length, and each row's segment id and position.

    Args:
        config: the model's config.
        batch: rows B.
        max_len: the longest sequence the caches hold.
        step_tokens: the most tokens a decode step feeds.

    Returns:
        The bytes.
    """
    layers = sum(
        MIXERS[kind].cache_bytes(config.for_kind(kind), batch, max_len, step_tokens) for kind in config.layer_kinds
    )
    return layers + 4 + 8 * batch


def size_config(base: LMConfig, target_params: int, *, multiple: int = 8) -> LMConfig:
    """Size a model to a parameter budget: sizes softmax, retention and hybrid models alike.

    Args:
        base: the config to size; heads, head dim and layers are kept.
        target_params: the parameter count to come closest to.
        multiple: d_model is a multiple of this (and, with M layers, of what makes ssm_expand * d_model whole heads in
            whole groups).

    Returns:
        `base` with the d_model whose parameter count is closest to `target_params`.
    """
    check_int("target_params", target_params)
    check_int("multiple", multiple)
    if "M" in base.pattern:
        group_width = base.ssm_groups * base.head_dim
        multiple = math.lcm(multiple, group_width // math.gcd(group_width, base.ssm_expand))
    with_width = lambda width: dataclasses.replace(base, d_model=width)
    lo, hi = 1, 2
    while count_params(with_width(hi * multiple)) < target_params:  # the count grows with d_model
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count_params(with_width(mid * multiple)) < target_params else (lo, mid)
    best = min((lo, hi), key=lambda m: abs(count_params(with_width(m * multiple)) - target_params))
    return with_width(best * multiple)
