"""Per-layer settings (LMConfig.layers) and the mixers' recipes: each layer kind is built and sized from its own
settings, power retention has no RoPE by default while softmax keeps it, the decay inits start where the recipe
table says (docs/DESIGN.md section 3), and a config is refused by name where a setting is wrong."""

import dataclasses
import json
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention.nn import (
    LM,
    GatedDeltaNet,
    GatedLinearAttention,
    LMConfig,
    Mamba2,
    PowerRetention,
    cache_bytes,
    count_params,
    decode_cache_bytes,
)
from retention.nn.gla import GATE_NORMALISER
from retention.nn.mamba2 import A_RANGES

HYBRID = LMConfig(vocab_size=40, d_model=32, n_layers=2, pattern="PA", n_heads=4, n_kv_heads=2, head_dim=8, window=5)


def mixer_output(config: LMConfig, letter: str, x_BTD, positions):
    """The first `letter` layer's mixer of LM(config) on x at the given RoPE positions."""
    model = LM(config, rngs=nnx.Rngs(0))
    block = next(b for b, kind in zip(model.blocks, config.layer_kinds) if kind == letter)
    return block.mixer(x_BTD, positions=positions)


def test_power_retention_has_no_rope_by_default_and_softmax_keeps_it():
    """The recipe: a P layer's output is the same at any positions (no RoPE); an A layer's moves when the
    positions are spaced three apart (RoPE rotates q and k by their offset), and so does a P layer's with
    layers.P.rope_base set."""
    x = jax.random.normal(jax.random.key(1), (2, 11, HYBRID.d_model))
    positions, moved = jnp.arange(11), 3 * jnp.arange(11)
    assert HYBRID.for_kind("P").rope_base is None and HYBRID.for_kind("A").rope_base == HYBRID.rope_base
    p_a, p_b = mixer_output(HYBRID, "P", x, positions), mixer_output(HYBRID, "P", x, moved)
    np.testing.assert_array_equal(np.asarray(p_a), np.asarray(p_b))
    a_a, a_b = mixer_output(HYBRID, "A", x, positions), mixer_output(HYBRID, "A", x, moved)
    assert float(jnp.max(jnp.abs(a_a - a_b))) > 1e-3
    with_rope = dataclasses.replace(HYBRID, layers={"P": {"rope_base": 10000.0}})
    r_a, r_b = mixer_output(with_rope, "P", x, positions), mixer_output(with_rope, "P", x, moved)
    assert float(jnp.max(jnp.abs(r_a - r_b))) > 1e-3


@pytest.mark.parametrize(
    "layers",
    [
        {"P": {"head_dim": 4, "deg": 4}, "A": {"head_dim": 16}},
        {"W": {"window": 3, "conv_size": 2}, "P": {"qk_norm": True, "gating": False}},
        {"D": {"head_dim": 4, "decay_init": "long"}, "M": {"head_dim": 16, "conv_size": 3}},
    ],
)
def test_each_kind_is_built_and_sized_from_its_own_settings(layers):
    """Parameters and decode-cache bytes from the config alone (the registry's formulas per kind) equal the built
    model's, with kinds whose head dims, degrees, windows and parts differ; the per-kind config is what the mixer
    holds."""
    pattern = "".join(dict.fromkeys("".join(layers) + "A"))
    config = dataclasses.replace(HYBRID, pattern=pattern, n_layers=len(pattern), layers=layers)
    model = LM(config, rngs=nnx.Rngs(0))
    assert count_params(config) == model.param_count()
    for batch, max_len in [(1, 9), (3, 40)]:
        made = jax.eval_shape(partial(model.init_caches, batch, max_len))
        assert decode_cache_bytes(config, batch, max_len) == cache_bytes(made)
    for block, kind in zip(model.blocks, config.layer_kinds):
        for key, value in layers.get(kind, {}).items():
            if key in ("head_dim", "deg", "window"):
                assert getattr(block.mixer, key) == value, (kind, key)


@pytest.mark.parametrize(
    "layers, words",
    [
        ({"Q": {}}, "'Q' is not a layer letter"),
        ({"P": {"n_layers": 3}}, "layers['P'] must be a mapping of some of"),
        ({"P": {"rope_base": 0.5}}, "layers['P']: rope_base must be None"),
        ({"A": {"head_dim": 7}}, "layers['A']: RoPE needs an even head_dim"),
        ({"D": {"decay_init": "short"}}, "layers['D']: decay_init must be one of ('paper', 'long')"),
        ({"P": {"deg": 3}}, "layers['P']: "),
        ("P", "layers must be a mapping"),
    ],
)
def test_bad_layer_settings_are_refused_by_name(layers, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        dataclasses.replace(HYBRID, layers=layers)


def test_layers_are_frozen_hashable_and_survive_a_record():
    """The config hashes (NNX keeps it in the graph) and refuses changes in place; dataclasses.asdict gives JSON
    that LMConfig.from_record reads back equal; a record written before per-layer settings existed has every
    layer on the config's fields (P with the record's RoPE)."""
    config = dataclasses.replace(HYBRID, layers={"P": {"rope_base": None, "deg": 4}})
    assert hash(config) == hash(dataclasses.replace(HYBRID, layers={"P": {"deg": 4, "rope_base": None}}))
    with pytest.raises(TypeError, match="cannot be changed in place"):
        config.layers["A"] = {}
    with pytest.raises(TypeError, match="cannot be changed in place"):
        config.layers["P"]["deg"] = 2
    record = json.loads(json.dumps(dataclasses.asdict(config)))
    assert LMConfig.from_record(record) == config
    del record["layers"]
    old = LMConfig.from_record(record)
    assert old.layers == {} and old.for_kind("P").rope_base == HYBRID.rope_base


def test_a_layer_without_rope_drops_the_rope_scaling():
    config = dataclasses.replace(HYBRID, rope_scaling="linear", rope_factor=4.0)
    assert config.for_kind("P").rope_scaling == "none" and config.for_kind("A").rope_scaling == "linear"


def per_token_decays(letter: str, decay_init: str, seed: int = 0) -> np.ndarray:
    """exp(log_g) of the first mixer of a fresh one-layer model of `letter` on the block's normalised random input:
    [B, T, heads] (GLA: [B, T, heads * d_k])."""
    config = LMConfig(
        vocab_size=40,
        d_model=32,
        n_layers=1,
        pattern=letter,
        n_heads=4,
        n_kv_heads=4,
        head_dim=8,
        decay_init=decay_init,
    )
    mixer = LM(config, rngs=nnx.Rngs(seed)).blocks[0].mixer
    x = jax.random.normal(jax.random.key(seed + 1), (4, 64, config.d_model))
    if letter == "G":
        logits = mixer.decay_up(mixer.decay_down(x))
        return np.exp(np.asarray(jax.nn.log_sigmoid(logits) / GATE_NORMALISER))
    if letter == "D":
        dt = jax.nn.softplus(mixer.a_proj(x) + mixer.dt_bias[...])
        return np.exp(np.asarray(-jnp.exp(mixer.A_log[...]) * dt))
    dt = jax.nn.softplus(mixer.in_proj(x)[..., -mixer.heads :] + mixer.dt_bias[...])
    return np.exp(np.asarray(-jnp.exp(mixer.A_log[...]) * dt))


@pytest.mark.parametrize("letter", ["D", "G", "M"])
def test_decay_inits_start_where_the_recipe_table_says(letter):
    """Over the far MQAR cell's 48-token gap, the median head's product of decays at init: the paper's init has
    forgotten most of a pair (D and M: Mamba2's ranges, below 0.2; G: 0.958 a token, below 0.2 too), the long
    init keeps most of it (above 0.5); A_log is drawn in its range."""
    paper = np.median(per_token_decays(letter, "paper")) ** 48
    long = np.median(per_token_decays(letter, "long")) ** 48
    assert paper < 0.2 < 0.5 < long, (paper, long)
    if letter != "G":
        config = LMConfig(vocab_size=40, d_model=32, n_layers=1, pattern=letter, head_dim=8, decay_init="long")
        A = np.exp(np.asarray(LM(config, rngs=nnx.Rngs(3)).blocks[0].mixer.A_log[...]))
        low, high = A_RANGES["long"]
        assert np.all((A >= low * (1 - 1e-6)) & (A <= high * (1 + 1e-6))) and math.isclose(high, 0.25)


def test_the_modules_alone_follow_the_recipe():
    """PowerRetention(...) alone is the recipe (4 conv taps, QK-norm, no RoPE, the gate) and, like the D, G and M
    mixers, runs without positions; a mixer with RoPE asks for them by name."""
    dims = dict(heads=4, kv_heads=2, head_dim=8)
    mixer = PowerRetention(32, **dims, rngs=nnx.Rngs(0))
    assert mixer.conv.q.kernel.shape[0] == 4 and mixer.qk_norm is not None and mixer.rope_base is None
    assert mixer.gate_proj is not None
    x = jax.random.normal(jax.random.key(0), (2, 9, 32))
    mixers = [mixer, GatedDeltaNet(32, **dims, rngs=nnx.Rngs(0)), GatedLinearAttention(32, **dims, rngs=nnx.Rngs(0))]
    mixers.append(Mamba2(32, head_dim=8, state_size=4, rngs=nnx.Rngs(0)))
    for m in mixers:
        y = m(x)
        assert y.shape == x.shape and np.isfinite(np.asarray(y)).all(), type(m).__name__
    with pytest.raises(ValueError, match=r"positions \(the tokens' RoPE positions"):
        PowerRetention(32, **dims, rope_base=1e4, rngs=nnx.Rngs(0))(x)
