"""A Hugging Face config.json of the Llama family as an LMConfig: every field that changes the computation is
mapped or refused with a ValueError naming it and its value; a field this import does not know is refused too
(it might change the computation), except those listed in NO_EFFECT (bookkeeping, training-only, generation).

Mapped: architectures (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM: q/k/v biases, Qwen3ForCausalLM:
q/k RMSNorm over the head dim), vocab_size, hidden_size, intermediate_size (the SwiGLU width, exactly),
num_hidden_layers, num_attention_heads, num_key_value_heads (GQA), head_dim, rms_norm_eps, tie_word_embeddings,
RoPE's theta and scaling (rope_parameters, or the older rope_theta and rope_scaling: types default, linear and
llama3; rope_scaling first when both are given, as transformers reads them), Mistral's sliding_window (every layer
a W layer of that window; None: A layers).
"""

from retention.nn import LMConfig

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
NO_EFFECT = frozenset(
    (
        "architectures model_type transformers_version dtype torch_dtype bos_token_id eos_token_id pad_token_id "
        "initializer_range use_cache max_position_embeddings attention_dropout pretraining_tp output_attentions "
        "output_hidden_states return_dict chunk_size_feed_forward is_encoder_decoder id2label label2id problem_type "
        "_name_or_path tokenizer_class max_window_layers rope_theta rope_scaling rope_parameters head_dim "
        "num_key_value_heads tie_word_embeddings rms_norm_eps sliding_window use_sliding_window layer_types "
        "attention_bias mlp_bias hidden_act vocab_size hidden_size intermediate_size num_hidden_layers "
        "num_attention_heads"
    ).split()
)
ROPE_KEYS = frozenset(
    "rope_type type rope_theta factor low_freq_factor high_freq_factor original_max_position_embeddings".split()
)


def require(hf: dict, key: str, where: str):
    """hf[key], a positive int; ValueError naming the field when it is missing or not one."""
    value = hf.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {key} must be a positive int, got {value!r}")
    return value


def refuse_unless(ok: bool, where: str, field: str, value, allowed: str) -> None:
    """ValueError naming the field, its value and what the import can do, unless ok."""
    if not ok:
        raise ValueError(f"{where}: {field}={value!r} is not supported by the import ({allowed})")


def refuse_unknown(hf: dict, known: set, where: str) -> None:
    """ValueError naming the first field of `hf` outside `known` (a field the import does not read might change the
    computation), unless there is none."""
    if unknown := sorted(set(hf) - known):
        raise ValueError(
            f"{where}: field {unknown[0]}={hf[unknown[0]]!r} is not one the import knows (it might change the "
            f"computation; unknown fields: {unknown[:6]})"
        )


def number(value, where: str, field: str) -> float:
    """`value` (the config field `field`) as a float; ValueError naming `where` and the field when it is no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {field}={value!r} must be a number")
    return float(value)


def _rope(hf: dict, where: str) -> dict:
    """LMConfig's RoPE fields as transformers reads them: rope_scaling when it is given (older configs, or one
    added beside transformers 5's rope_parameters), else rope_parameters; rope_theta from that dict, else the
    top-level rope_theta, else 10000. Beside rope_scaling, a rope_parameters.rope_theta other than that theta is
    refused (transformers drops it without a word)."""
    scaling, parameters = hf.get("rope_scaling"), hf.get("rope_parameters")
    field = "rope_scaling" if scaling else "rope_parameters"
    params = scaling or parameters or {}
    refuse_unless(isinstance(params, dict), where, field, params, "a dict")
    refuse_unless("full_attention" not in params, where, field, params, "one RoPE for every layer")
    for key in params:
        if key == "partial_rotary_factor":
            refuse_unless(params[key] == 1, where, f"{field}.{key}", params[key], "RoPE over the whole head: 1")
        else:
            refuse_unless(key in ROPE_KEYS, where, f"{field}.{key}", params[key], f"keys {sorted(ROPE_KEYS)}")
    key = "type" if "type" in params and "rope_type" not in params else "rope_type"
    kind = params.get(key, "default")
    allowed = "rope_type default, linear or llama3"
    refuse_unless(kind in ("default", "linear", "llama3"), where, f"{field}.{key}", kind, allowed)
    theta_field = f"{field}.rope_theta" if "rope_theta" in params else "rope_theta"
    theta = number(params.get("rope_theta", hf.get("rope_theta", 10000.0)), where, theta_field)
    if scaling and isinstance(parameters, dict) and "rope_theta" in parameters:
        ignored = number(parameters["rope_theta"], where, "rope_parameters.rope_theta")
        allowed = f"rope_scaling is read instead, with rope_theta={theta}: put rope_theta in rope_scaling"
        refuse_unless(ignored == theta, where, "rope_parameters.rope_theta", parameters["rope_theta"], allowed)
    out = dict(rope_base=theta)
    factor = lambda name: number(params.get(name), where, f"{field}.{name}")
    if kind == "linear":
        out |= dict(rope_scaling="linear", rope_factor=factor("factor"))
    elif kind == "llama3":
        original = params.get("original_max_position_embeddings", hf.get("max_position_embeddings"))
        out |= dict(
            rope_scaling="llama3",
            rope_factor=factor("factor"),
            rope_low_freq_factor=factor("low_freq_factor"),
            rope_high_freq_factor=factor("high_freq_factor"),
            rope_original_max_len=original,
        )
    return out


def lm_config_from_hf(hf: dict, where: str = "config.json") -> LMConfig:
    """The LMConfig (float32 parameters) of a Llama-family config.json `hf`; `where` names it in errors."""
    if not isinstance(hf, dict):
        raise ValueError(f"{where} must hold a JSON object, got {type(hf).__name__}")
    archs = hf.get("architectures")
    if not (isinstance(archs, list) and len(archs) == 1 and archs[0] in ARCHITECTURES):
        raise ValueError(f"{where}: architectures must be one of {list(ARCHITECTURES)}, got {archs!r}")
    arch = archs[0]
    refuse_unknown(hf, NO_EFFECT | {"use_mrope"}, where)
    refuse_unless(not hf.get("use_mrope"), where, "use_mrope", hf.get("use_mrope"), "1-D RoPE only: false")
    act = hf.get("hidden_act", "silu")
    refuse_unless(act in ("silu", "swish"), where, "hidden_act", act, "SwiGLU: silu")
    bias = hf.get("attention_bias", False)
    refuse_unless(bias is False, where, "attention_bias", bias, "no q/k/v/o biases except Qwen2's q/k/v")
    refuse_unless(hf.get("mlp_bias", False) is False, where, "mlp_bias", hf.get("mlp_bias"), "no MLP biases")
    pattern, window = "A", None
    if arch == "MistralForCausalLM" and hf.get("sliding_window") is not None:
        pattern, window = "W", require(hf, "sliding_window", where)
    if arch.startswith("Qwen"):
        sliding = hf.get("use_sliding_window", False)
        refuse_unless(not sliding, where, "use_sliding_window", sliding, "full attention in every layer: false")
    types = hf.get("layer_types")
    if types is not None:
        ok = isinstance(types, list) and all(t == "full_attention" for t in types)
        refuse_unless(ok, where, "layer_types", types, "full_attention in every layer")
    heads = require(hf, "num_attention_heads", where)
    d_model = require(hf, "hidden_size", where)
    head_dim = hf.get("head_dim") or d_model // heads
    kv_heads = hf.get("num_key_value_heads") or heads
    eps = hf.get("rms_norm_eps", 1e-6)
    tie = hf.get("tie_word_embeddings", False)
    refuse_unless(isinstance(tie, bool), where, "tie_word_embeddings", tie, "true or false")
    options = dict(
        vocab_size=require(hf, "vocab_size", where),
        d_model=d_model,
        n_layers=require(hf, "num_hidden_layers", where),
        pattern=pattern,
        n_heads=heads,
        n_kv_heads=kv_heads,
        head_dim=head_dim,
        mlp_width=require(hf, "intermediate_size", where),
        norm_eps=eps,
        tie_embeddings=tie,
        qk_norm=arch == "Qwen3ForCausalLM",
        qkv_bias=arch == "Qwen2ForCausalLM",
        **_rope(hf, where),
    )
    if window is not None:
        options["window"] = window
    try:
        return LMConfig(**options)
    except ValueError as e:
        raise ValueError(f"{where} maps to an LMConfig that is refused: {e}") from None
