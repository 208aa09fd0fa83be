"""The language model's hyperparameters: `LMConfig`, validated on construction, and the layer pattern's check
against the mixer registry.

Per-layer settings: `LMConfig.layers` maps a layer letter to the fields (LAYER_FIELDS) its layers take other than
the config's own, e.g. {"P": {"rope_base": None}} (power retention without RoPE, the default: RECIPE_LAYERS) or,
from Hydra, `model.layers.P.rope_base=10000.0`. `config.for_kind(letter)` is the config that letter's layers are
built and sized from."""

import dataclasses
from collections.abc import Mapping
from typing import Any

from retention.nn.conv import check_conv_size
from retention.nn.layers import check_heads, check_rope_base
from retention.nn.mamba2 import DECAY_INITS, check_mamba2_dims
from retention.nn.power_retention import GATE_BIAS_INIT
from retention.nn.registry import MIXERS
from retention.nn.remat import check_remat_policy
from retention.nn.rope import RopeScaling, check_rope_scaling
from retention.nn.scan import check_scannable
from retention.ops import ATTENTION_IMPLS, RETENTION_IMPLS, check_chunk_size, check_deg
from retention.ops.attention import KV_CACHE_BITS
from retention.validation import check_choice, check_int, check_number

FLOAT_DTYPES = ("float32", "bfloat16", "float16")
LAYER_FIELDS = (
    "rope_base",
    "window",
    "deg",
    "head_dim",
    "gating",
    "gate_bias_init",
    "decay_init",
    "conv_size",
    "qk_norm",
)
RECIPE_LAYERS = {"P": {"rope_base": None}}  # each letter's recipe where it differs from the fields (DESIGN section 3)


class FrozenLayers(dict):
    """`LMConfig.layers`: a dict that refuses changes and hashes by value (an LM keeps its config in its graph,
    which NNX hashes), so a config with per-layer settings is as immutable as the rest of the frozen dataclass."""

    def __hash__(self):
        return hash(tuple(sorted((key, tuple(sorted(value.items()))) for key, value in self.items())))

    def _refuse(self, *args, **kwargs):
        raise TypeError("LMConfig.layers cannot be changed in place: use dataclasses.replace(config, layers=...)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse


def _recipe_layers() -> dict:
    return {letter: dict(settings) for letter, settings in RECIPE_LAYERS.items()}


def check_layers(layers) -> FrozenLayers:
    """layers maps letters of the mixer registry to mappings of LAYER_FIELDS; returns it frozen (FrozenLayers, the
    inner mappings too). The values are checked by `LMConfig.for_kind`."""
    if not isinstance(layers, Mapping):
        raise ValueError(f"layers must be a mapping of layer letter -> settings, got {layers!r}")
    frozen = {}
    for letter, settings in layers.items():
        if letter not in MIXERS:
            raise ValueError(f"layers: {letter!r} is not a layer letter; the letters are {sorted(MIXERS)}")
        if not isinstance(settings, Mapping) or set(settings) - set(LAYER_FIELDS):
            raise ValueError(f"layers[{letter!r}] must be a mapping of some of {list(LAYER_FIELDS)}, got {settings!r}")
        frozen[letter] = FrozenLayers(settings)
    return FrozenLayers(frozen)


def check_pattern(pattern, n_layers: int) -> None:
    """pattern is a non-empty string over the registry's letters, no longer than n_layers: the pattern repeats over the
    layers, and one cut short would silently drop letters (PPPA at 2 layers is PP, with no attention)."""
    letters = {letter: kind.name for letter, kind in MIXERS.items()}
    if not isinstance(pattern, str) or not pattern or set(pattern) - set(MIXERS):
        raise ValueError(f"pattern must be a non-empty string over the letters {letters}, got {pattern!r}")
    if n_layers < len(pattern):
        raise ValueError(
            f"pattern={pattern!r} needs n_layers >= {len(pattern)} (at least one layer per letter; it repeats over "
            f"the layers), got n_layers={n_layers}, which would build only {pattern[:n_layers]!r}"
        )


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Hyperparameters of `LM`; validated on construction (a bad field raises ValueError naming it).

    Attributes:
        vocab_size: the token ids' range.
        d_model: the model width.
        n_layers: the blocks; at least len(pattern).
        pattern: a string over the mixer registry's letters (`MIXERS`), repeated over the layers: "A" softmax, "P"
            power retention, "PPPA" a 3:1 hybrid.
        n_heads: query heads.
        n_kv_heads: key/value heads, dividing n_heads.
        head_dim: d.
        mlp_ratio: the SwiGLU hidden width over d_model, when mlp_width is None.
        mlp_width: the SwiGLU hidden width; None: mlp_ratio * d_model rounded to a multiple of 8; 0: no MLP (a
            block is x + mixer(norm(x)) alone, as in Mamba2).
        deg: P layers: the even degree p.
        window: W layers: the sliding window's tokens.
        rope_base: RoPE's base; None: no RoPE (`layers` sets it per letter: P has none by default).
        rope_scaling: RoPE's frequencies rescaled as HF's rope_type: none, linear or llama3 (rope.py).
        rope_factor: linear: every frequency divided by this; llama3: the long wavelengths'.
        rope_low_freq_factor: llama3: wavelengths past rope_original_max_len / this are divided.
        rope_high_freq_factor: llama3: wavelengths below rope_original_max_len / this are kept.
        rope_original_max_len: llama3: the context the model was pretrained at.
        norm_eps: every RMSNorm's epsilon: the blocks', the final one, QK-norm's.
        tie_embeddings: the head is the embedding's transpose.
        dtype: the compute dtype (activations, KV cache); the recurrent states are always float32.
        param_dtype: the parameters' dtype.
        gating: P layers: a learnt per-kv-head decay gate.
        gate_bias_init: P layers: the gate's initial bias (sigmoid(4) = 0.98, a slow decay).
        decay_init: D, G, M layers: the decay's start, "long" (the recipe) or "paper" (DESIGN section 3).
        qk_norm: every layer: RMSNorm over the head dim of q and k.
        qkv_bias: every q/k/v layer: biases on the q, k and v projections (as Qwen2).
        conv_size: every layer: a causal depthwise convolution of this many taps on q, k and v (0: none).
        chunk_size: the chunked ops' chunk size; None: each op's default.
        ssm_state_size: M layers: Mamba2's state size N per group of B and C.
        ssm_expand: M layers: d_inner = ssm_expand * d_model, in heads of head_dim.
        ssm_groups: M layers: groups of B and C, each shared by n_heads_M / ssm_groups heads.
        retention_impl: the P layers' op path (power_retention's impl).
        attention_impl: the A and W layers' op path (softmax_attention's impl).
        kv_cache_bits: the A and W layers' decode cache: float (None) or quantized (8, 4 bits).
        scan_layers: stack the blocks by the pattern's period and run them with nnx.scan (scan.py).
        remat_policy: nnx.remat per block: none, full, save_projections, offload (remat.py).
        layers: per layer letter, the fields (LAYER_FIELDS) its layers take other than the config's own, e.g.
            {"P": {"rope_base": None}} (the default: RECIPE_LAYERS); `for_kind(letter)` applies them.
    """

    vocab_size: int = 256
    d_model: int = 512
    n_layers: int = 8
    pattern: str = "PPPA"
    n_heads: int = 8
    n_kv_heads: int = 8
    head_dim: int = 64
    mlp_ratio: float = 8 / 3
    mlp_width: int | None = None
    deg: int = 2
    window: int = 512
    rope_base: float | None = 10000.0
    rope_scaling: str = "none"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    dtype: str = "float32"
    param_dtype: str = "float32"
    gating: bool = True
    gate_bias_init: float = GATE_BIAS_INIT
    decay_init: str = "long"
    qk_norm: bool = False
    qkv_bias: bool = False
    conv_size: int = 0
    chunk_size: int | None = None
    ssm_state_size: int = 64
    ssm_expand: int = 2
    ssm_groups: int = 1
    retention_impl: str = "auto"
    attention_impl: str = "auto"
    kv_cache_bits: int | None = None
    scan_layers: bool = False
    remat_policy: str = "none"
    layers: dict[str, dict[str, Any]] = dataclasses.field(default_factory=_recipe_layers)

    def __post_init__(self):
        object.__setattr__(self, "layers", check_layers(self.layers))
        for name in ("vocab_size", "d_model", "n_layers", "window"):
            check_int(name, getattr(self, name))
        check_heads(self.n_heads, self.n_kv_heads, self.head_dim, names=("n_heads", "n_kv_heads", "head_dim"))
        check_pattern(self.pattern, self.n_layers)
        check_deg(self.deg)
        check_number("gate_bias_init", self.gate_bias_init)
        check_conv_size("conv_size", self.conv_size)
        check_number("mlp_ratio", self.mlp_ratio, low=0, open_low=True)
        if self.mlp_width is not None:
            check_int("mlp_width", self.mlp_width, low=0)
        check_rope_base(self.rope_base, self.head_dim)
        rope = ("rope_scaling", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_len")
        check_rope_scaling(*(getattr(self, name) for name in rope), names=rope)
        if self.rope_scaling != "none" and self.rope_base is None:
            raise ValueError(f"rope_scaling={self.rope_scaling!r} needs RoPE: a rope_base, got rope_base=None")
        check_number("norm_eps", self.norm_eps, low=0, open_low=True)
        if not isinstance(self.qkv_bias, bool):
            raise ValueError(f"qkv_bias must be a bool (True or False), got {self.qkv_bias!r}")
        for name in ("dtype", "param_dtype"):
            check_choice(name, getattr(self, name), FLOAT_DTYPES)
        check_chunk_size(self.chunk_size)
        names = ("d_model", "head_dim", "ssm_state_size", "ssm_expand", "ssm_groups")
        if "M" in self.pattern:
            check_mamba2_dims(*(getattr(self, name) for name in names), names=names)
        else:
            for name in names[2:]:
                check_int(name, getattr(self, name))
        check_choice("retention_impl", self.retention_impl, RETENTION_IMPLS)
        check_choice("attention_impl", self.attention_impl, ATTENTION_IMPLS)
        check_choice("kv_cache_bits", self.kv_cache_bits, (None, *KV_CACHE_BITS))
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"scan_layers must be a bool (True or False), got {self.scan_layers!r}")
        if self.scan_layers:
            check_scannable(self.pattern, self.n_layers)
        check_remat_policy(self.remat_policy)
        check_choice("decay_init", self.decay_init, DECAY_INITS)
        for letter in self.layers:
            try:
                self.for_kind(letter)
            except ValueError as error:
                raise ValueError(f"layers[{letter!r}]: {error}") from None

    @classmethod
    def from_record(cls, fields: Mapping[str, Any]) -> "LMConfig":
        """The LMConfig a run record, export or snapshot stored.

        A record written before per-layer settings existed has no `layers`, and every one of its layers followed the
        config's fields.

        Args:
            fields: dataclasses.asdict of an LMConfig.

        Returns:
            The config.
        """
        return cls(**{"layers": {}, **fields})

    def for_kind(self, letter: str) -> "LMConfig":
        """The config the `letter` layers are built and sized from.

        Args:
            letter: a layer letter of the registry.

        Returns:
            This config with layers[letter]'s settings (a layer without RoPE drops rope_scaling too) and no per-layer
                settings of its own.
        """
        settings = dict(self.layers.get(letter, {}))
        if not settings:
            return dataclasses.replace(self, layers={}) if self.layers else self
        if settings.get("rope_base", self.rope_base) is None:
            settings["rope_scaling"] = "none"
        return dataclasses.replace(self, **settings, layers={})

    @property
    def layer_kinds(self) -> str:
        """The mixer letter of each layer: the pattern repeated over n_layers (every letter appears)."""
        return "".join(self.pattern[i % len(self.pattern)] for i in range(self.n_layers))

    @property
    def mlp_hidden(self) -> int:
        """The SwiGLU hidden width: mlp_width (0: no MLP), or (None) mlp_ratio * d_model rounded to a multiple of 8."""
        if self.mlp_width is not None:
            return self.mlp_width
        return 8 * max(1, round(self.mlp_ratio * self.d_model / 8))

    @property
    def rope_frequency_scaling(self) -> RopeScaling | None:
        """The RoPE frequency scaling the q/k/v mixers apply (rope.py), None for rope_scaling="none"."""
        if self.rope_scaling == "none":
            return None
        return RopeScaling(
            self.rope_scaling,
            self.rope_factor,
            self.rope_low_freq_factor,
            self.rope_high_freq_factor,
            self.rope_original_max_len,
        )
