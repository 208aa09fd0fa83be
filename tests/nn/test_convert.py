"""Converting attention layers to fixed-state mixers: an all-A pattern (with identity convolution taps added or
not) gives the same logits bit for bit; a converted layer keeps the attention layer's q/k/v/o, and everything
outside the converted mixers is kept; the new gate and taps start as documented; the config states the layers
(rebuilding from it gives the same parameter tree); scanned models convert too; what cannot convert is refused
with its name."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention.nn import LM, LMConfig, convert
from retention.nn.convert import CONVERT_GATE_BIAS
from retention.nn.model import convert_layers

SOURCE = LMConfig(vocab_size=64, d_model=32, n_layers=2, pattern="A", n_heads=4, n_kv_heads=2, head_dim=8)


@pytest.fixture(scope="module")
def softmax_lm():
    return LM(SOURCE, rngs=nnx.Rngs(3))


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.key(1), (2, 12), 0, SOURCE.vocab_size)


@functools.partial(jax.jit, static_argnums=0)
def _logits(graphdef, state, tokens):
    return nnx.merge(graphdef, state)(tokens)


def logits(model, tokens):
    """The model's logits, compiled (once per model structure)."""
    return np.asarray(_logits(*nnx.split(model), tokens))


def pure(model):
    return nnx.to_pure_dict(nnx.state(model))


def test_all_a_changes_nothing(softmax_lm, tokens):
    want = logits(softmax_lm, tokens)
    for settings in ({}, {"conv_size": 4}):  # identity taps on every layer change nothing either
        same = convert(softmax_lm, "A", **settings)
        assert same.config.layer_kinds == "AA" and same.config.conv_size == settings.get("conv_size", 0)
        np.testing.assert_array_equal(logits(same, tokens), want)


def test_converted_layers_keep_the_attention_weights(softmax_lm, tokens):
    model = convert(softmax_lm, [0], conv_size=4, gate_bias_init=6.0)
    config = model.config
    assert (config.pattern, config.layer_kinds, config.n_kv_heads) == ("PA", "PA", 2)
    src, new = pure(softmax_lm), pure(model)
    for name in ("embed", "final_norm"):
        jax.tree.map(np.testing.assert_array_equal, new[name], src[name])
    for i in range(2):
        a, b = src["blocks"][i], new["blocks"][i]
        for part in ("mixer_norm", "mlp_norm", "mlp"):
            jax.tree.map(np.testing.assert_array_equal, b[part], a[part])
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            np.testing.assert_array_equal(b["mixer"][proj]["kernel"], a["mixer"][proj]["kernel"])
        for kernel in jax.tree.leaves(b["mixer"]["conv"]):  # identity taps: the current token's 1, the others 0
            np.testing.assert_array_equal(kernel[:-1], 0)
            np.testing.assert_array_equal(kernel[-1], 1)
        if i == 0:
            gate = b["mixer"]["gate_proj"]
            np.testing.assert_array_equal(gate["kernel"], 0)
            np.testing.assert_array_equal(gate["bias"], 6.0)
    assert config.for_kind("P").rope_base == SOURCE.rope_base  # q and k were trained rotated: P keeps RoPE
    rebuilt = nnx.eval_shape(lambda: LM(LMConfig(**dataclasses.asdict(config)), rngs=nnx.Rngs(0)))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), pure(rebuilt)) == jax.tree.map(lambda x: (x.shape, x.dtype), new)
    assert np.isfinite(logits(model, tokens)).all()
    np.testing.assert_array_equal(logits(softmax_lm, tokens), logits(convert(softmax_lm, "A"), tokens))


def test_layer_lists_other_mixers_and_scanned_models(softmax_lm, tokens):
    for letter in "WDG":
        model = convert(softmax_lm, [1], letter)
        assert model.config.layer_kinds == f"A{letter}" and model.config.pattern == f"A{letter}"
        np.testing.assert_array_equal(
            pure(model)["blocks"][1]["mixer"]["q_proj"]["kernel"],
            pure(softmax_lm)["blocks"][1]["mixer"]["q_proj"]["kernel"],
        )
    assert convert(softmax_lm, "PP").config.pattern == "P"  # the shortest period
    assert convert(softmax_lm, "PP").config.gate_bias_init == CONVERT_GATE_BIAS == 2.0
    assert convert(softmax_lm, "A").config == SOURCE
    scanned = convert_layers(softmax_lm, True)
    converted = convert(scanned, "PA")
    assert converted.config.scan_layers and converted.config.pattern == "PA"
    want = logits(convert(softmax_lm, "PA"), tokens)
    np.testing.assert_allclose(logits(converted, tokens), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "args, settings, match",
    [
        (("PM",), {}, r"'M' \(Mamba2\) cannot reuse .* one of \['D', 'G', 'P', 'W'\]"),
        (([1], "M"), {}, r"'M' \(Mamba2\) cannot reuse"),
        (("PPA",), {}, r"pattern='PPA' needs n_layers >= 3"),
        (([4],), {}, r"layers must be distinct ints in \[0, n_layers=2\), got \[4\]"),
        (([1, 1],), {}, r"layers must be distinct ints"),
        (("PA", "D"), {}, r"mixer_letter is read with a list of layers only"),
        ((3,), {}, r"pattern_or_layers must be a pattern string"),
        (("PA",), {"qk_norm": True}, r"mixer setting qk_norm=True is not one convert takes"),
    ],
)
def test_refusals_name_the_argument(softmax_lm, args, settings, match):
    with pytest.raises(ValueError, match=match):
        convert(softmax_lm, *args, **settings)


def test_only_attention_layers_convert():
    hybrid = LM(dataclasses.replace(SOURCE, pattern="PA", conv_size=2), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"layer 0 is 'P' \(power retention\): convert replaces A layers only"):
        convert(hybrid, "DA")
    with pytest.raises(ValueError, match=r"the model's \['P'\] layers were built with deg=2"):
        convert(hybrid, "P", deg=4)
    with pytest.raises(ValueError, match=r"conv_size=4: a model with conv_size=2 keeps it"):
        convert(hybrid, "P", conv_size=4)
    model = convert(hybrid, "P")
    assert model.config.pattern == "P"
    np.testing.assert_array_equal(
        pure(model)["blocks"][0]["mixer"]["gate_proj"]["kernel"],
        pure(hybrid)["blocks"][0]["mixer"]["gate_proj"]["kernel"],
    )
    with pytest.raises(TypeError, match="model must be an LM"):
        convert(jnp.zeros(3), "P")
