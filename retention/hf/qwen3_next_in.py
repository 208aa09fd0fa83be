"""transformers' Qwen3-Next (Qwen3NextForCausalLM) in: a config.json whose layers are all Gated DeltaNet
(linear_attention) with dense MLPs as an LMConfig of D layers with SwiGLU MLPs, its tensors as that LM's parameters.

What maps, term by term (transformers' Qwen3NextGatedDeltaNet against retention/nn/gated_deltanet.py):
- in_proj_qkvz is grouped by key head: for each of the K = linear_num_key_heads heads, [q (d_k), k (d_k), v (r d_v),
  z (r d_v)] with r = linear_num_value_heads / K; it splits into D's q_proj, k_proj, v_proj and gate_proj (z, the
  output gate). in_proj_ba is grouped the same way ([b (r), a (r)] per key head) into beta_proj and a_proj.
- Value heads > key heads: value head j reads q and k head j // r (repeat_interleave). D's heads pair one q and one
  k with each kv-head, so the import gives D H = linear_num_value_heads heads and kv-heads and repeats each q and k
  head's projection rows and conv taps r times: exact, at r times the q and k projections' weights.
- conv1d [2 K d_k + H d_v, 1, K_conv] (no bias) over the concatenated [q, k, v], then SiLU (hidden_act must be silu):
  D's short convolution on q, k and v (conv_size = linear_conv_kernel_dim, `split_conv1d`), then D's SiLU.
- q and k L2-normalised per head, x rsqrt(sum x^2 + 1e-6), in both; the op's query scale d_k^-0.5 in both.
- beta = sigmoid(b); log decay g = -exp(A_log) softplus(a + dt_bias), per value head: D's beta and log_g.
- The output: the gated RMSNorm weight * norm(o) * silu(z) over each head's d_v channels, its weight plain (not
  zero-centred), epsilon rms_norm_eps: D's o_norm * silu(gate_proj x), whose epsilon is fixed at
  gated_deltanet.NORM_EPS, so another rms_norm_eps is refused; out_proj: o_proj.
- Every other RMSNorm (input_layernorm, post_attention_layernorm, the final norm) is zero-centred, x (1 + w):
  imported as the scale 1 + w (the sum transformers takes in float32 too).
- The MLPs: Qwen3NextMLP is SwiGLU of intermediate_size (mlp_width).

Refused, by field name: linear_value_head_dim other than linear_key_head_dim (D has d_v = d_k),
linear_num_value_heads not a multiple of linear_num_key_heads, a full_attention layer (layer_types, or
full_attention_interval when layer_types is absent: their q_proj's second half is a sigmoid output gate and their
RoPE turns part of each head, neither of which A layers have), a mixture-of-experts MLP in any layer (num_experts > 0
with a layer outside mlp_only_layers on the decoder_sparse_step: the blocks have one SwiGLU), another hidden_act or
rms_norm_eps, a field this import does not know. A field left out of config.json takes Qwen3NextConfig's default
(DEFAULTS), as transformers reads it: a config without num_experts has 512 experts. The multi-token-prediction head
(mtp.* tensors) is skipped, as transformers skips it.
"""

import numpy as np

from retention.hf.config_in import number, refuse_unknown, refuse_unless, require
from retention.hf.mamba2_in import split_conv1d
from retention.hf.names import EMBEDDING, check_tensors
from retention.nn import LMConfig
from retention.nn.gated_deltanet import NORM_EPS

ARCHITECTURE = "Qwen3NextForCausalLM"
DEFAULTS = dict(  # transformers' Qwen3NextConfig, for the fields the import reads
    hidden_act="silu",
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    num_experts=512,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    full_attention_interval=4,
)
NO_EFFECT = frozenset(
    (
        # bookkeeping, generation; use_sliding_window and sliding_window are read by nothing in Qwen3-Next
        "architectures model_type transformers_version dtype torch_dtype bos_token_id eos_token_id pad_token_id "
        "initializer_range use_cache output_attentions output_hidden_states return_dict chunk_size_feed_forward "
        "is_encoder_decoder id2label label2id problem_type _name_or_path tokenizer_class use_sliding_window "
        "sliding_window "
        # read by the full-attention layers only (refused: layer_types)
        "num_attention_heads num_key_value_heads head_dim rope_parameters rope_theta rope_scaling "
        "partial_rotary_factor attention_bias attention_dropout max_position_embeddings "
        # read by the mixture-of-experts blocks only (refused: num_experts)
        "moe_intermediate_size shared_expert_intermediate_size num_experts_per_tok norm_topk_prob "
        "output_router_logits router_aux_loss_coef "
        # mapped
        "vocab_size hidden_size intermediate_size num_hidden_layers layer_types"
    ).split()
    + list(DEFAULTS)
)
LINEAR_ATTENTION = "linear_attention"
GATED_DELTANET = "in_proj_qkvz.weight in_proj_ba.weight conv1d.weight dt_bias A_log norm.weight out_proj.weight"


def _check_layer_types(hf: dict, n_layers: int, where: str) -> None:
    """Every layer linear_attention (Gated DeltaNet): layer_types, or without it every full_attention_interval-th
    layer is full attention, as transformers derives it."""
    why = "a full_attention layer gates its output by sigmoid and applies partial RoPE, which A layers do not"
    types = hf.get("layer_types")
    if types is None:
        interval = require(hf, "full_attention_interval", where)
        full = [i for i in range(n_layers) if (i + 1) % interval == 0]
        allowed = f"more than num_hidden_layers={n_layers}, no full_attention layer ({why}; layers {full[:8]})"
        refuse_unless(not full, where, "full_attention_interval", interval, allowed)
        return
    ok = isinstance(types, list) and len(types) == n_layers and all(t == LINEAR_ATTENTION for t in types)
    refuse_unless(ok, where, "layer_types", types, f"{LINEAR_ATTENTION} in each of the {n_layers} layers: {why}")


def _check_dense_mlps(hf: dict, n_layers: int, where: str) -> None:
    """No mixture-of-experts block: transformers makes layer i one when num_experts > 0, i is not in mlp_only_layers
    and (i + 1) % decoder_sparse_step == 0."""
    experts = hf["num_experts"]
    ok = isinstance(experts, int) and not isinstance(experts, bool) and experts >= 0
    refuse_unless(ok, where, "num_experts", experts, "an int >= 0")
    dense = hf["mlp_only_layers"]
    ok = isinstance(dense, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in dense)
    refuse_unless(ok, where, "mlp_only_layers", dense, "a list of layer indices")
    sparse = [i for i in range(n_layers) if i not in dense]
    if experts == 0 or not sparse:
        return
    step = require(hf, "decoder_sparse_step", where)
    moe = [i for i in sparse if (i + 1) % step == 0]
    allowed = (
        "dense SwiGLU MLPs only: 0, or mlp_only_layers listing every layer the decoder_sparse_step makes a mixture "
        f"of experts (here layers {moe[:8]}{' ...' if len(moe) > 8 else ''}), which the blocks' one SwiGLU cannot be"
    )
    refuse_unless(not moe, where, "num_experts", experts, allowed)


def qwen3_next_config_from_hf(hf: dict, where: str = "config.json") -> LMConfig:
    """The LMConfig (float32 parameters) of transformers' Qwen3-Next config.json `hf`: D layers with SwiGLU MLPs; a
    field the import cannot honour (module docstring), or one it does not know, raises ValueError naming it.

    Args:
        hf: the config.json's object, architectures ["Qwen3NextForCausalLM"].
        where: the file, for the errors.

    Returns:
        The LMConfig: H = linear_num_value_heads heads and kv-heads of head_dim linear_key_head_dim.
    """
    refuse_unless(
        hf.get("architectures") == [ARCHITECTURE], where, "architectures", hf.get("architectures"), ARCHITECTURE
    )
    refuse_unknown(hf, NO_EFFECT, where)
    hf = DEFAULTS | hf
    n_layers = require(hf, "num_hidden_layers", where)
    _check_dense_mlps(hf, n_layers, where)
    _check_layer_types(hf, n_layers, where)
    act = hf["hidden_act"]
    refuse_unless(act in ("silu", "swish"), where, "hidden_act", act, "the conv's and SwiGLU's SiLU: silu")
    eps = number(hf["rms_norm_eps"], where, "rms_norm_eps")
    allowed = f"D's gated output RMSNorm epsilon, {NORM_EPS}"
    refuse_unless(eps == NORM_EPS, where, "rms_norm_eps", hf["rms_norm_eps"], allowed)
    key_heads, value_heads = (require(hf, k, where) for k in ("linear_num_key_heads", "linear_num_value_heads"))
    allowed = f"a multiple of linear_num_key_heads={key_heads}"
    refuse_unless(value_heads % key_heads == 0, where, "linear_num_value_heads", value_heads, allowed)
    d_k, d_v = (require(hf, k, where) for k in ("linear_key_head_dim", "linear_value_head_dim"))
    allowed = f"D's d_v = d_k: linear_key_head_dim={d_k}"
    refuse_unless(d_v == d_k, where, "linear_value_head_dim", d_v, allowed)
    tie = hf["tie_word_embeddings"]
    refuse_unless(isinstance(tie, bool), where, "tie_word_embeddings", tie, "true or false")
    options = dict(
        vocab_size=require(hf, "vocab_size", where),
        d_model=require(hf, "hidden_size", where),
        n_layers=n_layers,
        pattern="D",
        n_heads=value_heads,
        n_kv_heads=value_heads,
        head_dim=d_k,
        mlp_width=require(hf, "intermediate_size", where),
        rope_base=None,
        norm_eps=eps,
        tie_embeddings=tie,
        conv_size=require(hf, "linear_conv_kernel_dim", where),
    )
    try:
        return LMConfig(**options)
    except ValueError as e:
        raise ValueError(f"{where} maps to an LMConfig that is refused: {e}") from None


def key_heads(hf: dict) -> int:
    """linear_num_key_heads of a config.json `qwen3_next_config_from_hf` accepted (its default when left out).

    Args:
        hf: the config.json's object.

    Returns:
        The key heads K, which group in_proj_qkvz, in_proj_ba and conv1d.
    """
    return (DEFAULTS | hf)["linear_num_key_heads"]


def qwen3_next_names(lm: LMConfig) -> list[str]:
    """The tensors of `lm`'s Qwen3-Next checkpoint.

    Args:
        lm: the LMConfig of `qwen3_next_config_from_hf`.

    Returns:
        Their names: lm_head's unless the embeddings are tied, none of the mtp.* head's.
    """
    names = [EMBEDDING, "model.norm.weight"] + ([] if lm.tie_embeddings else ["lm_head.weight"])
    for i in range(lm.n_layers):
        layer = f"model.layers.{i}"
        names += [f"{layer}.input_layernorm.weight", f"{layer}.post_attention_layernorm.weight"]
        names += [f"{layer}.linear_attn.{name}" for name in GATED_DELTANET.split()]
        names += [f"{layer}.mlp.{name}_proj.weight" for name in ("gate", "up", "down")]
    return names


def _shaped(x: np.ndarray, shape: tuple, name: str, where: str) -> np.ndarray:
    """`x` (the tensor `name`) when its shape is `shape`; ValueError naming it otherwise."""
    if x.shape != shape:
        raise ValueError(f"{where}: {name} is {list(x.shape)}, the config's model needs {list(shape)}")
    return x


def _gated_deltanet(lm: LMConfig, get, prefix: str, key_heads: int, where: str) -> dict:
    """The D mixer's parameters from one Qwen3NextGatedDeltaNet's tensors (`get(name)`, named under `prefix`)."""
    D, H, K, d = lm.d_model, lm.n_heads, key_heads, lm.head_dim
    r = H // K
    qkvz = _shaped(get("in_proj_qkvz.weight"), (K * (2 * d + 2 * r * d), D), f"{prefix}.in_proj_qkvz.weight", where)
    q, k, v, z = np.split(qkvz.reshape(K, 2 * d + 2 * r * d, D), [d, 2 * d, (2 + r) * d], axis=1)
    ba = _shaped(get("in_proj_ba.weight"), (2 * H, D), f"{prefix}.in_proj_ba.weight", where).reshape(K, 2 * r, D)
    name = f"{prefix}.conv1d.weight"
    q_taps, k_taps, v_taps = split_conv1d(get("conv1d.weight"), [K * d, K * d, H * d], name, where)
    heads = lambda w: w.reshape(H * d, D).T  # [K, r * d or d (repeated), D] -> kernel [D, H d]
    repeat = lambda w: heads(np.repeat(w, r, axis=0))  # key head g serves value heads g r ... g r + r - 1
    repeat_taps = lambda t: np.repeat(t.reshape(-1, K, d), r, axis=1).reshape(-1, H * d)
    return dict(
        q_proj=dict(kernel=repeat(q)),
        k_proj=dict(kernel=repeat(k)),
        v_proj=dict(kernel=heads(v)),
        gate_proj=dict(kernel=heads(z)),
        beta_proj=dict(kernel=ba[:, :r].reshape(H, D).T),
        a_proj=dict(kernel=ba[:, r:].reshape(H, D).T),
        conv=dict(q=dict(kernel=repeat_taps(q_taps)), k=dict(kernel=repeat_taps(k_taps)), v=dict(kernel=v_taps)),
        dt_bias=get("dt_bias"),
        A_log=get("A_log"),
        o_norm=dict(scale=get("norm.weight")),
        o_proj=dict(kernel=get("out_proj.weight").T),
    )


def pure_from_qwen3_next(lm: LMConfig, tensors: dict[str, np.ndarray], where: str, *, key_heads: int) -> dict:
    """The unscanned LM's parameters as a pure dict (nnx.to_pure_dict's nesting) from a Qwen3-Next checkpoint's
    `tensors`.

    Args:
        lm: the LMConfig of `qwen3_next_config_from_hf`.
        tensors: the checkpoint's tensors by name.
        where: the weights' place, for the errors.
        key_heads: the config's linear_num_key_heads (`key_heads`).

    Returns:
        The pure dict.

    Raises:
        ValueError: tensors missing, not of this model, not floating-point or of another shape, naming them.
    """
    skipped = {n for n in tensors if n.startswith("mtp.")} | ({"lm_head.weight"} if lm.tie_embeddings else set())
    check_tensors(tensors, qwen3_next_names(lm), skipped, where)
    centred = lambda name: tensors[name].astype(np.float32) + 1  # the zero-centred RMSNorm's x (1 + w)
    blocks = {}
    for i in range(lm.n_layers):
        layer = f"model.layers.{i}"
        get = lambda name, layer=layer: tensors[f"{layer}.linear_attn.{name}"]
        mlp = {ours: dict(kernel=tensors[f"{layer}.mlp.{ours}_proj.weight"].T) for ours in ("gate", "up", "down")}
        blocks[i] = dict(
            mixer_norm=dict(scale=centred(f"{layer}.input_layernorm.weight")),
            mixer=_gated_deltanet(lm, get, f"{layer}.linear_attn", key_heads, where),
            mlp_norm=dict(scale=centred(f"{layer}.post_attention_layernorm.weight")),
            mlp=mlp,
        )
    pure = dict(
        embed=dict(embedding=tensors[EMBEDDING]), blocks=blocks, final_norm=dict(scale=centred("model.norm.weight"))
    )
    if not lm.tie_embeddings:
        pure["head"] = dict(kernel=tensors["lm_head.weight"].T)
    return pure
