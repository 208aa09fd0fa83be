"""Attention layers turned into fixed-state mixers: `convert(model, "PPPA")` or `convert(model, [1, 3])`.

A converted layer keeps the softmax layer's q, k, v and output projections (and its head grouping: the same
n_heads and n_kv_heads), its QK-norm scales and convolution taps when it has them; the embeddings, the norms, the
MLPs and every layer not converted are kept as they are. Only mixers built on `QKVMixer` (the same q_proj, k_proj,
v_proj and o_proj) can take those weights: P (power retention), W (sliding-window attention), D (Gated DeltaNet)
and G (GLA); M (Mamba2: one fused input projection, no q/k/v) is refused.

How the new parameters start, so that a converted layer starts close to the softmax layer it replaces:
- P: the softmax layers' RoPE (when the model has no P layer yet: `layers["P"]["rope_base"]` set to the A
  layers' rope_base, since q and k were trained rotated), the gate's kernel 0 and its bias `gate_bias_init`
  (CONVERT_GATE_BIAS = 2.0 unless given), so every token's gate is sigmoid(gate_bias_init) whatever the input
  (0.88 at 2: a key's weight halves every 5 tokens).
  Power retention weighs key j by (q_i . k_j)^deg over the same q and k; its scale cancels in the normalisation.
  Why 2 and not near no decay: a trained softmax layer attends mostly nearby, and the held-out loss right after
  conversion (experiments/conversion_loss.py, results/conversion_loss.json: a 4-layer byte-level teacher at 1.645
  nats) is 2.05 for PA at bias 0 or 2, 2.69 at 4 and 2.93 at 8 (2.16, 3.23, 3.45 for PPPA).
- W: no new parameters (the same layer with a window).
- D and G: their gates, decays and output norms keep the mixer's own fresh initialisation (seeded by `seed`): they
  reuse q/k/v/o but do not start near the softmax layer (they have no RoPE, and normalise and gate the output).
- `conv_size` from 0 to K (a setting): every layer, converted or not, gets the causal convolution with identity
  taps (tap K - 1, the current token, 1; the others 0), which changes nothing until training moves them.

The converted model's LMConfig states its layers exactly: its `pattern` is the shortest period (dividing
n_layers) of the new layer kinds, so saving and loading it builds the same model.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from retention.nn.config import LMConfig, check_pattern
from retention.nn.model import LM, convert_layers
from retention.nn.qkv import QKVMixer
from retention.nn.registry import MIXERS

SETTINGS = ("deg", "gating", "gate_bias_init", "chunk_size", "retention_impl", "window", "conv_size")
SHARED = ("q_proj", "k_proj", "v_proj", "o_proj", "qk_norm", "conv")  # what a converted mixer takes over
CONVERT_GATE_BIAS = 2.0  # a converted P layer's gate bias unless gate_bias_init is given (module docstring)


def reuses_qkvo(letter: str) -> bool:
    """Whether the registry's mixer `letter` has the softmax layer's q/k/v/o projections (a QKVMixer)."""
    config = LMConfig(vocab_size=8, d_model=8, n_layers=1, pattern=letter, n_heads=1, n_kv_heads=1, head_dim=8)
    return isinstance(nnx.eval_shape(lambda: MIXERS[letter].build(config, rngs=nnx.Rngs(0))), QKVMixer)


def target_kinds(kinds: str, pattern_or_layers, mixer_letter: str) -> str:
    """The layer kinds after conversion, from the model's `kinds` (one letter per layer) and a pattern (repeated
    over the layers; 'A' keeps a layer) or a list of layer indices (each becomes `mixer_letter`). Only A layers
    change; a letter that cannot reuse q/k/v/o is refused."""
    n = len(kinds)
    if isinstance(pattern_or_layers, str):
        check_pattern(pattern_or_layers, n)
        if mixer_letter != "P":
            raise ValueError(
                f"mixer_letter is read with a list of layers only; a pattern gives its letters itself, got "
                f"mixer_letter={mixer_letter!r} with pattern={pattern_or_layers!r}"
            )
        wanted = "".join(pattern_or_layers[i % len(pattern_or_layers)] for i in range(n))
    elif isinstance(pattern_or_layers, (list, tuple)) and pattern_or_layers:
        layers = list(pattern_or_layers)
        bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n]
        if bad or len(set(layers)) != len(layers):
            raise ValueError(f"layers must be distinct ints in [0, n_layers={n}), got {layers}")
        if mixer_letter not in MIXERS:
            raise ValueError(f"mixer_letter must be one of {sorted(MIXERS)}, got {mixer_letter!r}")
        wanted = "".join(mixer_letter if i in layers else "A" for i in range(n))
    else:
        raise ValueError(
            f"pattern_or_layers must be a pattern string (e.g. 'PPPA') or a non-empty list of layer indices, got "
            f"{pattern_or_layers!r}"
        )
    for i, (have, want) in enumerate(zip(kinds, wanted)):
        if want not in ("A", have) and have != "A":
            raise ValueError(
                f"layer {i} is {have!r} ({MIXERS[have].name}): convert replaces A layers only, got {want!r} for it "
                f"(layer kinds {kinds!r}, asked {wanted!r})"
            )
        if want not in ("A", have) and not reuses_qkvo(want):
            allowed = sorted(letter for letter in MIXERS if letter != "A" and reuses_qkvo(letter))
            raise ValueError(
                f"{want!r} ({MIXERS[want].name}) cannot reuse an attention layer's q/k/v/o projections: convert to "
                f"one of {allowed}"
            )
    return "".join(have if want == "A" else want for have, want in zip(kinds, wanted))


def shortest_pattern(kinds: str) -> str:
    """The shortest period of `kinds` whose length divides len(kinds) (so scan_layers can stack it)."""
    n = len(kinds)
    return next(kinds[:p] for p in range(1, n + 1) if n % p == 0 and kinds == kinds[:p] * (n // p))


def converted_config(config: LMConfig, kinds: str, settings: dict) -> LMConfig:
    """The LMConfig of the converted model: `kinds` as its pattern, the mixer `settings` applied (unscanned)."""
    for key, value in settings.items():
        if key not in SETTINGS:
            raise ValueError(f"mixer setting {key}={value!r} is not one convert takes; it takes {list(SETTINGS)}")
    kept = sorted(set(config.layer_kinds) - {"A"})
    for key, value in settings.items():
        if key not in ("conv_size", "gate_bias_init") and value != getattr(config, key) and kept:
            raise ValueError(
                f"mixer setting {key}={value!r}: the model's {kept} layers were built with {key}="
                f"{getattr(config, key)!r}, which applies to every layer; convert keeps it"
            )
    conv = settings.get("conv_size", config.conv_size)
    if conv != config.conv_size and config.conv_size:
        raise ValueError(
            f"conv_size={conv!r}: a model with conv_size={config.conv_size} keeps it (only a model without a "
            "convolution, conv_size=0, gets identity taps)"
        )
    new_p = any(now == "P" != have for have, now in zip(config.layer_kinds, kinds))
    settings = {"gate_bias_init": CONVERT_GATE_BIAS, **settings} if new_p else settings
    layers = dict(config.layers)
    if new_p and "P" not in config.layer_kinds:  # the P layers are all new: they keep their q and k's RoPE
        layers["P"] = {**layers.get("P", {}), "rope_base": config.for_kind("A").rope_base}
    return dataclasses.replace(config, pattern=shortest_pattern(kinds), scan_layers=False, layers=layers, **settings)


def _identity_conv(conv: dict) -> dict:
    """The conv's kernels (q, k, v: [K, C] each) as identity taps: the last (the current token) 1, the others 0."""
    return jax.tree.map(lambda w: jnp.zeros(w.shape, w.dtype).at[-1].set(1), conv)


def convert(model: LM, pattern_or_layers, mixer_letter: str = "P", *, seed: int = 0, **mixer_settings) -> LM:
    """A new LM with the A layers that `pattern_or_layers` names replaced by fixed-state mixers initialised from
    them (module docstring); `model` is unchanged.

    The result has the source's form (scan_layers) when its pattern allows; an all-A pattern returns an equal model.

    ```python
    hybrid = convert(model, "PPPA")  # or convert(model, [1, 3], "P")
    ```

    Args:
        model: the source, with A layers.
        pattern_or_layers (str | list[int]): a pattern over the mixer letters, repeated over the layers like
            LMConfig.pattern ('A' keeps a layer: "PPPA", "PA", "P"), or a list of layer indices that become
            `mixer_letter`.
        mixer_letter: the letter those indices become (P, W, D or G: a mixer with q/k/v/o projections).
        seed: the fresh parameters of D and G.
        **mixer_settings (Any): LMConfig fields of the new mixers (`SETTINGS`: deg, gating, gate_bias_init (default
            CONVERT_GATE_BIAS when a layer becomes P), chunk_size, retention_impl, window, conv_size from 0).

    Returns:
        The converted model.
    """
    if not isinstance(model, LM):
        raise TypeError(f"model must be an LM, got {type(model).__name__}")
    source = model.config
    kinds = target_kinds(source.layer_kinds, pattern_or_layers, mixer_letter)
    target = converted_config(source, kinds, mixer_settings)
    flat = convert_layers(model, False)
    params = nnx.to_pure_dict(nnx.state(flat))
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: LM(target, rngs=nnx.Rngs(0))))
    add_conv = target.conv_size and not source.conv_size
    rngs, new = nnx.Rngs(seed), nnx.to_pure_dict(abstract)["blocks"]
    for i, (have, now) in enumerate(zip(source.layer_kinds, kinds)):
        block = params["blocks"][i]
        if have != now:
            mixer = nnx.to_pure_dict(nnx.state(MIXERS[now].build(target, rngs=rngs)))
            mixer.update({name: block["mixer"][name] for name in SHARED if name in block["mixer"]})
            if "gate_proj" in mixer and now == "P":
                gate = mixer["gate_proj"]
                bias = jnp.full_like(gate["bias"], target.gate_bias_init)
                mixer["gate_proj"] = {"kernel": jnp.zeros_like(gate["kernel"]), "bias": bias}
            block["mixer"] = mixer
        if add_conv:
            block["mixer"]["conv"] = _identity_conv(new[i]["mixer"]["conv"])
    nnx.replace_by_pure_dict(abstract, params)
    converted = nnx.merge(graphdef, abstract)
    return convert_layers(converted, True) if source.scan_layers else converted
