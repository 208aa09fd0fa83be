"""Hugging Face checkpoints in and out: `load_hf(folder)` imports a Llama-family, Mamba2 or Qwen3-Next checkpoint
(load.py: config_in.py maps or refuses each Llama-family config field, names.py maps its tensors, mamba2_in.py does
both for transformers' Mamba2, qwen3_next_in.py for Qwen3-Next's Gated DeltaNet layers, files.py reads the folder);
config_out.py writes an LM's config as a Hugging Face config.json, the Llama layout (names.py) when transformers can
run it unchanged; tokenizer_out.py an export's tokenizer_config.json, special_tokens_map.json and
generation_config.json."""

from retention.hf.load import load_hf

__all__ = ["load_hf"]
