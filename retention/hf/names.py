"""The Llama family's tensor names against the LM's parameters, both ways.

An LM whose layers are all softmax attention (A, or W as Mistral's sliding window) has the Llama layout: each of
its parameters is one Hugging Face tensor, a Linear's kernel [in, out] transposed to the weight [out, in]. The
heads need no permutation: q_proj's output is head-major in both ([Hq, d] per token), RoPE rotates the pairs
(x_i, x_{i + d/2}) in both (rotate_half), and query head h reads kv head h // (Hq / H) in both.
"""

import jax.numpy as jnp
import numpy as np

from retention.nn import LMConfig

EMBEDDING = "model.embed_tokens.weight"
IGNORED = ("rotary_emb.inv_freq",)  # a buffer older checkpoints saved: RoPE's frequencies, recomputed here


def llama_table(lm: LMConfig) -> list[tuple[tuple, str, bool]]:
    """(the parameter's path in the unscanned LM's pure dict, the HF tensor name, whether it is transposed) for
    every parameter of `lm` in the Llama layout (Qwen2's q/k/v biases with qkv_bias, Qwen3's q/k norms with
    qk_norm, lm_head unless the embeddings are tied)."""
    table = [(("embed", "embedding"), "model.embed_tokens.weight", False)]
    for i in range(lm.n_layers):
        hf, ours = f"model.layers.{i}", ("blocks", i)
        table += [
            ((*ours, "mixer_norm", "scale"), f"{hf}.input_layernorm.weight", False),
            ((*ours, "mlp_norm", "scale"), f"{hf}.post_attention_layernorm.weight", False),
        ]
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            table.append(((*ours, "mixer", name, "kernel"), f"{hf}.self_attn.{name}.weight", True))
        if lm.qkv_bias:
            for name in ("q_proj", "k_proj", "v_proj"):
                table.append(((*ours, "mixer", name, "bias"), f"{hf}.self_attn.{name}.bias", False))
        if lm.qk_norm:
            for name in ("q_norm", "k_norm"):
                table.append(((*ours, "mixer", "qk_norm", name, "scale"), f"{hf}.self_attn.{name}.weight", False))
        for name, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            table.append(((*ours, "mlp", name, "kernel"), f"{hf}.mlp.{theirs}.weight", True))
    table.append((("final_norm", "scale"), "model.norm.weight", False))
    if not lm.tie_embeddings:
        table.append((("head", "kernel"), "lm_head.weight", True))
    return table


def own_head(tensors: dict[str, np.ndarray], embedding: str = EMBEDDING) -> bool:
    """Whether `tensors` hold an lm_head.weight other than the embedding (the tensor named `embedding`; transformers
    then keeps the head, untied, even when the config ties the embeddings)."""
    head, embedding = tensors.get("lm_head.weight"), tensors.get(embedding)
    return head is not None and not (embedding is not None and np.array_equal(head, embedding))


def check_tensors(tensors: dict[str, np.ndarray], wanted: list[str], skipped: set[str], where: str) -> None:
    """That `tensors` are a checkpoint's of the model whose tensor names are `wanted`, every one floating-point.

    Args:
        tensors: the checkpoint's tensors by name.
        wanted: the names the model reads.
        skipped: names that may be there and are not read (a tied head, saved RoPE frequencies, ...).
        where: the weights' place, for the errors.

    Raises:
        ValueError: naming `where` and the tensors missing or not of this model, or the first that is not
            floating-point (integer or quantized weights are not imported).
    """
    extra, missing = sorted(tensors.keys() - set(wanted) - skipped), sorted(set(wanted) - tensors.keys())
    if missing or extra:
        raise ValueError(
            f"{where} does not hold the tensors of this model (config.json's): missing {missing[:4]}"
            f"{' ...' if len(missing) > 4 else ''}, not of it {extra[:4]}{' ...' if len(extra) > 4 else ''}"
        )
    if not_float := [n for n in sorted(wanted) if not jnp.issubdtype(tensors[n].dtype, jnp.floating)]:
        raise ValueError(
            f"{where}: {not_float[0]} is {tensors[not_float[0]].dtype}, not a floating-point tensor (integer or "
            f"quantized weights are not imported; tensors that are not float: {not_float[:4]})"
        )


def pure_from_llama(lm: LMConfig, tensors: dict[str, np.ndarray], where: str) -> dict:
    """The unscanned LM's parameters as a pure dict (nnx.to_pure_dict's nesting) from Llama-layout `tensors`;
    ValueError naming `where` and the tensors missing, not of this model or not floating-point (an lm_head equal to the
    tied embedding and RoPE's saved frequencies are skipped)."""
    table = llama_table(lm)
    skipped = {"lm_head.weight"} if lm.tie_embeddings and not own_head(tensors) else set()
    skipped |= {n for n in tensors if n.endswith(IGNORED)}
    check_tensors(tensors, [name for _, name, _ in table], skipped, where)
    pure = {}
    for path, name, transposed in table:
        node = pure
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = tensors[name].T if transposed else tensors[name]
    return pure


def llama_from_pure(lm: LMConfig, pure: dict) -> dict[str, np.ndarray]:
    """The Llama-layout tensors {HF name: array [out, in] for a Linear} of the unscanned LM's pure dict."""
    out = {}
    for path, name, transposed in llama_table(lm):
        node = pure
        for key in path:
            node = node[key]
        value = np.asarray(node)
        out[name] = np.ascontiguousarray(value.T) if transposed else value
    return out
