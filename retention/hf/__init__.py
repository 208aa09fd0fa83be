"""Hugging Face checkpoints in and out: `load_hf(folder)` imports a Llama-family or Mamba2 checkpoint (load.py:
config_in.py maps or refuses each Llama-family config field, names.py maps its tensors, mamba2_in.py does both for
transformers' Mamba2, files.py reads the folder); config_out.py writes an LM's config as a Hugging Face
config.json, the Llama layout (names.py) when transformers can run it unchanged; tokenizer_out.py an export's
tokenizer_config.json, special_tokens_map.json and generation_config.json."""

from retention.hf.load import load_hf

__all__ = ["load_hf"]
