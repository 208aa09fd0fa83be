"""Import: `load_hf(folder)` turns a Hugging Face checkpoint folder of the Llama family into an LM of softmax
attention layers (A; W for Mistral's sliding window) and its tokenizer.

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
from retention.hf.config_in import lm_config_from_hf
from retention.hf.files import CONFIG, read_json, read_tokenizer, read_weights
from retention.hf.names import own_head, pure_from_llama
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
    attention layers; see config_in.py for what is mapped and what is refused.

    ```python
    model, tokenizer = load_hf("Qwen3-0.6B")  # a local folder; float32 parameters
    logits = model(jnp.asarray(tokenizer.encode("def f(x):"), jnp.int32)[None])
    ```

    Args:
        folder: config.json, model.safetensors or its shards, tokenizer.json.

    Returns:
        The LM (float32 parameters) and its tokenizer.

    Raises:
        ValueError: a config field the import cannot honour (naming the field and its value), a missing or unreadable
            file, or tensors that are not the config's model's.
    """
    if not isinstance(folder, (str, os.PathLike)) or not os.path.isdir(folder):
        raise ValueError(f"folder must be a Hugging Face checkpoint folder, got {folder!r} (not a folder)")
    folder = os.fspath(folder)
    config_path = os.path.join(folder, CONFIG)
    config = read_json(config_path)
    lm = lm_config_from_hf(config, config_path)
    tokenizer = read_tokenizer(folder, config)
    tensors = read_weights(folder)
    if lm.tie_embeddings and own_head(tensors):
        log.warning(
            "%s: tie_word_embeddings is true but the weights in %s hold an lm_head.weight other than "
            "model.embed_tokens.weight: that head is kept, untied, as transformers does (set tie_word_embeddings to "
            "false to say so)",
            *(config_path, folder),
        )
        lm = dataclasses.replace(lm, tie_embeddings=False)
    pure = pure_from_llama(lm, tensors, f"the weights in {folder}")
    return build_lm(lm, pure, folder), tokenizer
