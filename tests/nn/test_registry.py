"""The mixer registry's formulas against the modules they describe: for every letter, the parameter count of the
built mixer and the bytes of its `init_cache` at several batches, lengths and step sizes (float and quantized KV,
bf16, with and without the short convolution, QK-norm and q/k/v biases), whether the cache is fixed in length and
whether it bounds a decode step by step_tokens."""

import dataclasses
from functools import partial

import jax
import pytest
from flax import nnx

from retention.nn import MIXERS, LMConfig, cache_bytes

BASE = LMConfig(vocab_size=40, d_model=24, n_layers=1, pattern="P", n_heads=4, n_kv_heads=2, head_dim=6, window=5)
VARIANTS = [
    {},
    dict(conv_size=4, qk_norm=True, dtype="bfloat16"),
    dict(conv_size=2, gating=False, deg=4, kv_cache_bits=8, qkv_bias=True),
    dict(kv_cache_bits=4, head_dim=8, n_kv_heads=4, ssm_state_size=5, ssm_groups=3, ssm_expand=4, conv_size=3),
]


@pytest.mark.parametrize("letter", sorted(MIXERS))
@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_formulas_equal_the_module(letter, variant):
    config = dataclasses.replace(BASE, pattern=letter, **VARIANTS[variant])
    kind = MIXERS[letter]
    mixer = kind.build(config, rngs=nnx.Rngs(0))
    params = sum(x.size for x in jax.tree.leaves(nnx.state(mixer, nnx.Param)))
    assert kind.params(config) == params
    for batch, max_len, step_tokens in [(1, 7, 1), (3, 33, 1), (2, 33, 4), (2, 500, 2)]:
        made = jax.eval_shape(partial(mixer.init_cache, batch, max_len, config.dtype, step_tokens=step_tokens))
        assert kind.cache_bytes(config, batch, max_len, step_tokens) == cache_bytes(made)
    assert kind.fixed_state == (kind.cache_bytes(config, 1, 10) == kind.cache_bytes(config, 1, 10_000))
    assert kind.step_bounded == (kind.cache_bytes(config, 1, 100, 1) != kind.cache_bytes(config, 1, 100, 4))


def test_every_letter_is_a_valid_pattern():
    for letter, kind in MIXERS.items():
        assert len(letter) == 1 and letter.isupper() and kind.name
        LMConfig(pattern=letter, n_layers=1)
