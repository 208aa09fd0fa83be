"""Tiny random Llama-family checkpoints built with transformers (float32, saved with save_pretrained) and a tiny
tokenizer.json, for the import and export tests; and transformers' logits of a checkpoint."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 96
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=48,
    intermediate_size=72,  # not a multiple of 8 of hidden_size * 8/3: the width is the config's, exactly
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # not hidden_size / heads (12): head_dim is read, never derived
    rms_norm_eps=1e-5,
    initializer_range=0.1,  # logits of order 1 and peaked attention, so a misplaced weight or position shows
    eos_token_id=1,
)


def tiny_tokenizer(path) -> None:
    """A word-level tokenizer.json of VOCAB ids: <unk>, </s>, then words w2 ... w95, split on whitespace."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "</s>": 1} | {f"w{i}": i for i in range(2, VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


def save_tiny(folder, architecture: str, **overrides):
    """A tiny random `architecture` (LlamaForCausalLM, ...) saved to `folder` with tiny_tokenizer; returns the
    transformers model (float32, eval mode). The norms' weights are random too, so a misplaced one shows."""
    config_class = getattr(transformers, architecture.replace("ForCausalLM", "Config"))
    config = config_class(**(SIZES | overrides))
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight") or name.endswith(".bias"):
                p.copy_(1 + 0.5 * torch.randn_like(p) if "norm" in name else 0.5 * torch.randn_like(p))
    model.save_pretrained(folder)
    tiny_tokenizer(folder / "tokenizer.json")
    return model


def torch_logits(model, tokens: np.ndarray) -> np.ndarray:
    """transformers' float32 logits [B, T, V] of tokens [B, T]."""
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.float().numpy()
