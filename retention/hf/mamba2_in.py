"""transformers' Mamba2 (Mamba2ForCausalLM) in: its config.json as an LMConfig of M layers without MLPs, its tensors
as that LM's parameters.

transformers' Mamba2 block is x + mixer(norm(x)) (no MLP: LMConfig mlp_width 0), and its mixer is the M mixer term
by term (retention/nn/mamba2.py): in_proj to [z, x, B, C, dt] in that order (d_inner, d_inner, n_groups * N,
n_groups * N, H), no bias (use_bias true is refused); a depthwise causal conv1d over [x, B, C] with a bias (the M
mixer's conv.q, conv.k, conv.v kernels and its conv_bias; use_conv_bias false loads a zero bias), weight [C, 1, K]
whose tap K - 1 is the current token as in `causal_conv`; SiLU after it (hidden_act must be silu); dt =
softplus(dt + dt_bias) (time_step_limit's clamp must be a no-op: a low <= 0, a high of infinity); A = -exp(A_log);
head h reads group h // (H / n_groups) (repeat_interleave, jnp.repeat); y + D x; the gated RMSNorm norm(y * SiLU(z))
over each group's d_inner / n_groups channels, its weight after (norm_before_gate false); out_proj. Every norm's
epsilon is layer_norm_epsilon in transformers; the M mixer's gated norm has a fixed 1e-5 (mamba2.NORM_EPS, the
Mamba2 configs' value), so another layer_norm_epsilon is refused. residual_in_fp32 changes nothing in float32, and
chunk_size only the order of the roundings.
"""

import math

import numpy as np

from retention.hf.config_in import number, refuse_unknown, refuse_unless, require
from retention.hf.names import check_tensors
from retention.nn import LMConfig
from retention.nn.mamba2 import NORM_EPS

ARCHITECTURE = "Mamba2ForCausalLM"
EMBEDDING, OLD_EMBEDDING = "backbone.embeddings.weight", "backbone.embedding.weight"  # transformers reads both
MAPPED = (
    "vocab_size hidden_size num_hidden_layers num_heads head_dim state_size expand n_groups conv_kernel "
    "layer_norm_epsilon use_bias use_conv_bias hidden_act time_step_limit tie_word_embeddings"
).split()
NO_EFFECT = frozenset(
    (
        "architectures model_type transformers_version dtype torch_dtype bos_token_id eos_token_id pad_token_id "
        "initializer_range use_cache output_attentions output_hidden_states return_dict chunk_size_feed_forward "
        "is_encoder_decoder id2label label2id problem_type _name_or_path tokenizer_class chunk_size residual_in_fp32 "
        "rescale_prenorm_residual time_step_rank time_step_min time_step_max time_step_floor"
    ).split()
    + MAPPED
)


def _float(value, where: str, field: str) -> float:
    """A number of config.json, infinity written as transformers 5 writes it ({"__float__": "Infinity"}) too."""
    if isinstance(value, dict) and set(value) == {"__float__"} and isinstance(value["__float__"], str):
        try:
            return float(value["__float__"])
        except ValueError:
            pass
    return number(value, where, field)


def _time_step_limit(hf: dict, where: str) -> None:
    """transformers clamps dt to time_step_limit: refused unless the clamp changes nothing (softplus is >= 0)."""
    limit = hf.get("time_step_limit", [0.0, math.inf])
    ok = isinstance(limit, (list, tuple)) and len(limit) == 2
    low, high = (_float(x, where, "time_step_limit") for x in limit) if ok else (None, None)
    allowed = "no clamp of dt: [0.0, Infinity] or a lower low"
    refuse_unless(ok and low <= 0 and high == math.inf, where, "time_step_limit", limit, allowed)


def mamba2_config_from_hf(hf: dict, where: str = "config.json") -> LMConfig:
    """The LMConfig (float32 parameters) of transformers' Mamba2 config.json `hf`: M layers without MLPs; a field
    the M mixer cannot honour, or one this import does not know, raises ValueError naming it; `where` names the
    file in errors.

    Args:
        hf: the config.json's object, architectures ["Mamba2ForCausalLM"].
        where: the file, for the errors.

    Returns:
        The LMConfig.
    """
    refuse_unless(
        hf.get("architectures") == [ARCHITECTURE], where, "architectures", hf.get("architectures"), ARCHITECTURE
    )
    refuse_unknown(hf, NO_EFFECT, where)
    act = hf.get("hidden_act", "silu")
    refuse_unless(act in ("silu", "swish"), where, "hidden_act", act, "the M mixer's SiLU: silu")
    refuse_unless(hf.get("use_bias", False) is False, where, "use_bias", hf.get("use_bias"), "no in/out_proj bias")
    conv_bias = hf.get("use_conv_bias", True)
    refuse_unless(isinstance(conv_bias, bool), where, "use_conv_bias", conv_bias, "true or false")
    eps = _float(hf.get("layer_norm_epsilon", 1e-5), where, "layer_norm_epsilon")
    allowed = f"the M mixer's gated RMSNorm epsilon, {NORM_EPS}"
    refuse_unless(eps == NORM_EPS, where, "layer_norm_epsilon", hf.get("layer_norm_epsilon"), allowed)
    _time_step_limit(hf, where)
    tie = hf.get("tie_word_embeddings", False)
    refuse_unless(isinstance(tie, bool), where, "tie_word_embeddings", tie, "true or false")
    d_model, heads, head_dim = (require(hf, key, where) for key in ("hidden_size", "num_heads", "head_dim"))
    expand = require(hf, "expand", where)
    allowed = f"num_heads * head_dim = expand * hidden_size = {expand * d_model}"
    refuse_unless(heads * head_dim == expand * d_model, where, "num_heads", heads, allowed)
    groups = require(hf, "n_groups", where)
    refuse_unless(heads % groups == 0, where, "n_groups", groups, f"a divisor of num_heads={heads}")
    options = dict(
        vocab_size=require(hf, "vocab_size", where),
        d_model=d_model,
        n_layers=require(hf, "num_hidden_layers", where),
        pattern="M",
        n_heads=heads,
        n_kv_heads=heads,
        head_dim=head_dim,
        mlp_width=0,
        rope_base=None,
        norm_eps=eps,
        tie_embeddings=tie,
        conv_size=require(hf, "conv_kernel", where),
        ssm_state_size=require(hf, "state_size", where),
        ssm_expand=expand,
        ssm_groups=groups,
    )
    try:
        return LMConfig(**options)
    except ValueError as e:
        raise ValueError(f"{where} maps to an LMConfig that is refused: {e}") from None


def renamed_embedding(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`tensors` with an older checkpoint's backbone.embedding.weight named backbone.embeddings.weight, as
    transformers' Mamba2Model renames it when it loads."""
    if EMBEDDING in tensors or OLD_EMBEDDING not in tensors:
        return tensors
    return {EMBEDDING if name == OLD_EMBEDDING else name: x for name, x in tensors.items()}


def split_conv1d(weight: np.ndarray, splits: list[int], name: str, where: str) -> list[np.ndarray]:
    """A depthwise torch Conv1d's weight as the kernels of `causal_conv`, one per channel group.

    Args:
        weight: the conv1d.weight [C, 1, K] (tap K - 1 reads the current token, as in `causal_conv`).
        splits: the groups' channel counts (Mamba2's x, B and C; Qwen3-Next's q, k and v), summing to C.
        name: the tensor's name, for the errors.
        where: the weights' place, for the errors.

    Returns:
        The kernels [K, C_i], one per group.

    Raises:
        ValueError: a weight that is not [sum(splits), 1, K], naming it.
    """
    if weight.ndim != 3 or weight.shape[1] != 1 or weight.shape[0] != sum(splits):
        raise ValueError(f"{where}: {name} is {list(weight.shape)}, the config's model needs [{sum(splits)}, 1, K]")
    return [np.ascontiguousarray(w[:, 0].T) for w in np.split(weight, np.cumsum(splits)[:-1], axis=0)]


def mamba2_names(lm: LMConfig) -> list[str]:
    """The tensors of `lm`'s Mamba2 checkpoint (the conv bias included; lm_head unless tied)."""
    names = [EMBEDDING, "backbone.norm_f.weight"] + ([] if lm.tie_embeddings else ["lm_head.weight"])
    for i in range(lm.n_layers):
        names.append(f"backbone.layers.{i}.norm.weight")
        for name in "in_proj.weight conv1d.weight conv1d.bias dt_bias A_log D norm.weight out_proj.weight".split():
            names.append(f"backbone.layers.{i}.mixer.{name}")
    return names


def pure_from_mamba2(lm: LMConfig, tensors: dict[str, np.ndarray], where: str, *, conv_bias: bool = True) -> dict:
    """The unscanned LM's parameters as a pure dict (nnx.to_pure_dict's nesting) from a Mamba2 checkpoint's
    `tensors`.

    Args:
        lm: the LMConfig of `mamba2_config_from_hf`.
        tensors: the checkpoint's tensors by name (`renamed_embedding`'s).
        where: the weights' place, for the errors.
        conv_bias: config.json's use_conv_bias; False: the checkpoint has no conv1d.bias and the LM's is zero.

    Returns:
        The pure dict.

    Raises:
        ValueError: tensors missing, not of this model or not floating-point, naming them.
    """
    wanted = [n for n in mamba2_names(lm) if conv_bias or not n.endswith("conv1d.bias")]
    check_tensors(tensors, wanted, {"lm_head.weight"} if lm.tie_embeddings else set(), where)
    d_inner, bc = lm.ssm_expand * lm.d_model, lm.ssm_groups * lm.ssm_state_size
    blocks = {}
    for i in range(lm.n_layers):
        get = lambda name, i=i: tensors[f"backbone.layers.{i}.mixer.{name}"]
        conv_name = f"backbone.layers.{i}.mixer.conv1d.weight"
        x_taps, b_taps, c_taps = split_conv1d(tensors[conv_name], [d_inner, bc, bc], conv_name, where)
        bias = get("conv1d.bias") if conv_bias else np.zeros((d_inner + 2 * bc,), np.float32)
        mixer = dict(
            in_proj=dict(kernel=get("in_proj.weight").T),
            conv=dict(q=dict(kernel=x_taps), k=dict(kernel=b_taps), v=dict(kernel=c_taps)),
            conv_bias=bias,
            dt_bias=get("dt_bias"),
            A_log=get("A_log"),
            D=get("D"),
            norm_scale=get("norm.weight"),
            out_proj=dict(kernel=get("out_proj.weight").T),
        )
        blocks[i] = dict(mixer_norm=dict(scale=tensors[f"backbone.layers.{i}.norm.weight"]), mixer=mixer)
    pure = dict(
        embed=dict(embedding=tensors[EMBEDDING]),
        blocks=blocks,
        final_norm=dict(scale=tensors["backbone.norm_f.weight"]),
    )
    if not lm.tie_embeddings:
        pure["head"] = dict(kernel=tensors["lm_head.weight"].T)
    return pure
