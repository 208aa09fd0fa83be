"""Import: `load_hf(folder)` turns a Hugging Face checkpoint folder of the Llama family into an LM of softmax
attention layers (A; W for Mistral's sliding window), one of transformers' Mamba2 into an LM of Mamba2 layers
(M, no MLPs: mamba2_in.py), or a Qwen3-Next whose layers are all Gated DeltaNet with dense MLPs into an LM of D
layers (qwen3_next_in.py), and its tokenizer.

    model, tokenizer = retention.hf.load_hf("Qwen3-0.6B")
    logits = model(jnp.asarray(tokenizer.encode("def f(x):"))[None])

The parameters are float32 whatever the checkpoint's dtype (bfloat16 and float16 convert exactly). A config that
ties the embeddings over a file holding a head of its own gets that head, untied, with a warning, as in
transformers."""

import dataclasses
import logging
import os

import jax
import numpy as np
from flax import nnx

from retention.data.tokenizer import HFTokenizer
from retention.hf.config_in import ARCHITECTURES, lm_config_from_hf
from retention.hf.files import CONFIG, read_json, read_tokenizer, read_weights
from retention.hf.mamba2_in import ARCHITECTURE as MAMBA2
from retention.hf.mamba2_in import EMBEDDING, mamba2_config_from_hf, pure_from_mamba2, renamed_embedding
from retention.hf.names import EMBEDDING as LLAMA_EMBEDDING
from retention.hf.names import own_head, pure_from_llama
from retention.hf.qwen3_next_in import ARCHITECTURE as QWEN3_NEXT
from retention.hf.qwen3_next_in import key_heads, pure_from_qwen3_next, qwen3_next_config_from_hf
from retention.nn import LM, LMConfig

log = logging.getLogger(__name__)


def build_lm(lm: LMConfig, pure: dict, where: str) -> LM:
    """The unscanned LM of `lm` holding the parameters of the pure dict `pure` (nnx.to_pure_dict's nesting), each
    cast to its parameter dtype; ValueError naming `where` and the parameter when a shape differs."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(0))))
    flat_pure = dict(jax.tree_util.tree_leaves_with_path(pure))
    placed = {}
    for path, x in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(abstract)):
        value = np.asarray(flat_pure[path])
        if value.shape != x.shape:
            name = jax.tree_util.keystr(path, simple=True, separator=".")
            raise ValueError(f"{where}: {name} is {list(value.shape)}, the config's model needs {list(x.shape)}")
        placed[path] = jax.numpy.asarray(value.astype(x.dtype))
    nnx.replace_by_pure_dict(abstract, jax.tree_util.tree_map_with_path(lambda p, _: placed[p], pure))
    return nnx.merge(graphdef, abstract)


def load_hf(folder: str) -> tuple[LM, HFTokenizer]:
    """Import a Hugging Face checkpoint of the Llama family (Llama, Mistral, Qwen2, Qwen3) as an LM of softmax
    attention layers, a Mamba2ForCausalLM as an LM of M layers without MLPs, or a Qwen3NextForCausalLM whose layers
    are all Gated DeltaNet with dense MLPs as an LM of D layers; see config_in.py, mamba2_in.py and qwen3_next_in.py
    for what is mapped and what is refused.

    ```python
    model, tokenizer = load_hf("Qwen3-0.6B")  # a local folder; float32 parameters
    logits = model(jnp.asarray(tokenizer.encode("def f(x):"), jnp.int32)[None])
    ```

    Args:
        folder: config.json, model.safetensors or its shards, tokenizer.json.

    Returns:
        The LM (float32 parameters) and its tokenizer.

    Raises:
        ValueError: an architecture other than those, a config field the import cannot honour (naming the field and
            its value; before any weight is read), a missing or unreadable file, or tensors that are not the config's
            model's.
    """
    if not isinstance(folder, (str, os.PathLike)) or not os.path.isdir(folder):
        raise ValueError(f"folder must be a Hugging Face checkpoint folder, got {folder!r} (not a folder)")
    folder = os.fspath(folder)
    config_path = os.path.join(folder, CONFIG)
    config = read_json(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object, got {type(config).__name__}")
    archs = config.get("architectures")
    if not (isinstance(archs, list) and len(archs) == 1 and archs[0] in ARCHITECTURES + (MAMBA2, QWEN3_NEXT)):
        known = [*ARCHITECTURES, MAMBA2, QWEN3_NEXT]
        raise ValueError(f"{config_path}: architectures must be one of {known}, got {archs!r}")
    mamba2, qwen3_next = archs == [MAMBA2], archs == [QWEN3_NEXT]
    config_from_hf = {MAMBA2: mamba2_config_from_hf, QWEN3_NEXT: qwen3_next_config_from_hf}
    lm = config_from_hf.get(archs[0], lm_config_from_hf)(config, config_path)
    tokenizer = read_tokenizer(folder, config)
    tensors = read_weights(folder)
    if mamba2:
        tensors = renamed_embedding(tensors)
    embedding = EMBEDDING if mamba2 else LLAMA_EMBEDDING
    if lm.tie_embeddings and own_head(tensors, embedding):
        log.warning(
            "%s: tie_word_embeddings is true but the weights in %s hold an lm_head.weight other than %s: that head "
            "is kept, untied, as transformers does (set tie_word_embeddings to false to say so)",
            *(config_path, folder, embedding),
        )
        lm = dataclasses.replace(lm, tie_embeddings=False)
    where = f"the weights in {folder}"
    if mamba2:
        pure = pure_from_mamba2(lm, tensors, where, conv_bias=config.get("use_conv_bias", True))
    elif qwen3_next:
        pure = pure_from_qwen3_next(lm, tensors, where, key_heads=key_heads(config))
    else:
        pure = pure_from_llama(lm, tensors, where)
    return build_lm(lm, pure, folder), tokenizer
