"""Reading a Hugging Face checkpoint folder: config.json, the weights (model.safetensors, or the shards listed by
model.safetensors.index.json) and the tokenizer (tokenizer.json, its end token from config.json's eos_token_id or
tokenizer_config.json's eos_token). A missing or unreadable file raises ValueError naming it."""

import json
import os

import numpy as np

from retention.data.tokenizer import HFTokenizer

CONFIG, WEIGHTS, INDEX, TOKENIZER = "config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json"


def read_json(path: str) -> dict:
    """The JSON object in the file at `path`; ValueError naming it when it is missing or not JSON."""
    if not os.path.isfile(path):
        raise ValueError(f"{path} is missing: a Hugging Face checkpoint folder holds it")
    try:
        with open(path) as f:
            return json.load(f)
    except (ValueError, OSError) as e:
        raise ValueError(f"{path} cannot be read as JSON ({type(e).__name__}: {e})") from None


def _read_safetensors(path: str, names=None) -> dict[str, np.ndarray]:
    """The tensors (all, or `names`) of one safetensors file as numpy arrays; ValueError naming the file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="numpy") as f:
            return {name: f.get_tensor(name) for name in (f.keys() if names is None else names)}
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read as safetensors ({type(e).__name__}: {e})") from None


def read_weights(folder: str) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint in `folder`: model.safetensors, or the shards its index names."""
    single, index = os.path.join(folder, WEIGHTS), os.path.join(folder, INDEX)
    if os.path.isfile(single):
        return _read_safetensors(single)
    if not os.path.isfile(index):
        raise ValueError(f"{folder} holds no weights: neither {WEIGHTS} nor {INDEX} (safetensors only)")
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index} must map tensor names to shard files under weight_map, got {weight_map!r}")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, []).append(name)
    tensors = {}
    for shard, names in sorted(shards.items()):
        path = os.path.join(folder, shard)
        if os.path.basename(shard) != shard or not os.path.isfile(path):
            raise ValueError(f"{index} names the shard {shard!r}, which is not a file in {folder}")
        tensors |= _read_safetensors(path, names)
    return tensors


def end_token(folder: str, config: dict) -> str:
    """The text of the checkpoint's end-of-sequence token: config.json's eos_token_id (the first of a list) in
    tokenizer.json's vocab, else tokenizer_config.json's eos_token; ValueError naming both when neither is there."""
    from tokenizers import Tokenizer

    eos = config.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if isinstance(eos, int) and not isinstance(eos, bool):
        token = Tokenizer.from_file(os.path.join(folder, TOKENIZER)).id_to_token(eos)
        if token is not None:
            return token
    path = os.path.join(folder, "tokenizer_config.json")
    token = read_json(path).get("eos_token") if os.path.isfile(path) else None
    token = token.get("content") if isinstance(token, dict) else token
    if not isinstance(token, str) or not token:
        raise ValueError(
            f"{folder} names no end token: config.json's eos_token_id is {config.get('eos_token_id')!r} (not an id "
            f"of {TOKENIZER}) and tokenizer_config.json has no eos_token"
        )
    return token


def read_tokenizer(folder: str, config: dict) -> HFTokenizer:
    """The checkpoint's tokenizer.json as an HFTokenizer (a document encoder: no BOS added) ending documents with
    its end-of-sequence token; the raw `tokenizers.Tokenizer` is its `.tokenizer`."""
    path = os.path.join(folder, TOKENIZER)
    if not os.path.isfile(path):
        raise ValueError(f"{path} is missing: the import reads the tokenizer from tokenizer.json")
    return HFTokenizer.load(path, end_token(folder, config))
