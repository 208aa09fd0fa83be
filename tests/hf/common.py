"""Tiny random Llama-family, Mamba2 and Qwen3-Next checkpoints built with transformers (float32, saved with
save_pretrained) and a tiny tokenizer.json, for the import and export tests; transformers' logits and greedy tokens of
a checkpoint; random texts, and the check that transformers' tokenizer of an export encodes them as the run's."""

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 96
ISSUE_TEXT = ":\n    return"  # issue 41: AutoTokenizer of an export without tokenizer_config.json split it in two
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

MAMBA2_SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_heads=8,
    head_dim=8,  # 8 * 8 = expand 2 * hidden_size 32
    expand=2,
    state_size=6,
    n_groups=1,
    conv_kernel=4,
    num_hidden_layers=2,
    initializer_range=0.1,
    chunk_size=8,  # transformers' chunked scan crosses chunks in the tests' 19 tokens
    eos_token_id=1,
)

QWEN3_NEXT_SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=36,
    intermediate_size=52,
    num_hidden_layers=2,
    layer_types=["linear_attention"] * 2,  # Gated DeltaNet in every layer
    num_experts=0,  # dense MLPs
    linear_num_key_heads=2,
    linear_num_value_heads=2,
    linear_key_head_dim=12,
    linear_value_head_dim=12,
    linear_conv_kernel_dim=4,
    initializer_range=0.1,
    eos_token_id=1,
    use_cache=False,  # transformers 5.25's Qwen3-Next builds no cache mask without a full-attention layer
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


def save_tiny_mamba2(folder, **overrides):
    """A tiny random Mamba2ForCausalLM (MAMBA2_SIZES with `overrides`) saved to `folder` with tiny_tokenizer;
    returns the transformers model (float32, eval mode). The norms' weights, the conv bias, D and dt_bias are random
    too (transformers starts them at 1, 0, 1 and a narrow range), so a misplaced one shows."""
    config = transformers.Mamba2Config(**(MAMBA2_SIZES | overrides))
    torch.manual_seed(0)
    model = transformers.Mamba2ForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
                p.copy_(1 + 0.5 * torch.randn_like(p))
            elif name.endswith(("conv1d.bias", "mixer.D", "dt_bias", "A_log")):
                p.copy_(0.5 * torch.randn_like(p) + (-1.0 if name.endswith("dt_bias") else 0.0))
    model.save_pretrained(folder)
    tiny_tokenizer(folder / "tokenizer.json")
    return model


def save_tiny_qwen3_next(folder, **overrides):
    """A tiny random Qwen3NextForCausalLM (QWEN3_NEXT_SIZES with `overrides`) saved to `folder` with tiny_tokenizer;
    returns the transformers model (float32, eval mode). The zero-centred norms' weights (transformers starts them at
    0), the gated output norm's (at 1), dt_bias and A_log are random too, so a misplaced one shows."""
    config = transformers.Qwen3NextConfig(**(QWEN3_NEXT_SIZES | overrides))
    torch.manual_seed(0)
    model = transformers.Qwen3NextForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 * torch.randn_like(p) + (1.0 if name.endswith("linear_attn.norm.weight") else 0.0))
            elif name.endswith(("dt_bias", "A_log")):
                p.copy_(0.5 * torch.randn_like(p) - 1.0)
    model.save_pretrained(folder)
    tiny_tokenizer(folder / "tokenizer.json")
    return model


def assert_float32_close(got, want):
    """Equal to float32 rounding: 1e-5 relative, 1e-5 of the largest logit absolute."""
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def assert_gives_transformers_logits(model, reference, tokens: np.ndarray, t0: int, step: int) -> None:
    """`model` (an LM) gives the transformers model `reference`'s logits of tokens [B, T] to float32 rounding, in one
    forward and in a prefill of t0 tokens then decode steps of `step` tokens."""
    want = torch_logits(reference, tokens)
    assert_float32_close(np.asarray(model(jnp.asarray(tokens, jnp.int32))), want)
    logits, caches = model.prefill(jnp.asarray(tokens[:, :t0], jnp.int32), tokens.shape[1], step_tokens=step)
    steps = [np.asarray(logits)]
    for t in range(t0, tokens.shape[1], step):
        logits, caches = model.decode_step(jnp.asarray(tokens[:, t : t + step], jnp.int32), caches)
        steps.append(np.asarray(logits))
    assert_float32_close(np.concatenate(steps, axis=1), want)


def torch_logits(model, tokens: np.ndarray) -> np.ndarray:
    """transformers' float32 logits [B, T, V] of tokens [B, T]."""
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.float().numpy()


def greedy_reference(model, prompt: np.ndarray, n: int) -> np.ndarray:
    """transformers' greedy continuation: n times, the argmax of its logits at the last position appended."""
    tokens = prompt
    for _ in range(n):
        tokens = np.concatenate([tokens, torch_logits(model, tokens)[:, -1].argmax(-1)[:, None]], axis=1)
    return tokens


def random_texts(rng: np.random.Generator, n: int) -> list[str]:
    """`n` random texts of 0 to 40 characters drawn from ASCII, whitespace (newlines, tabs, runs of spaces, NUL),
    Latin and Greek (2 UTF-8 bytes), CJK (3) and emoji (4), each text from a few of these pools; with ISSUE_TEXT."""
    pools = [
        [chr(c) for c in range(0x20, 0x7F)],
        ["\n", "\t", " ", "    ", "\r\n", "\x00"],
        [chr(c) for c in range(0xA0, 0x400)],
        [chr(c) for c in range(0x4E00, 0x4F00)],
        [chr(c) for c in range(0x1F600, 0x1F650)],
    ]
    texts = [ISSUE_TEXT]
    for _ in range(n - 1):
        chosen = [pools[i] for i in rng.choice(len(pools), rng.integers(1, 4), replace=False)]
        texts.append("".join(rng.choice(chosen[rng.integers(len(chosen))]) for _ in range(rng.integers(0, 41))))
    return texts


def assert_encodes_as(auto, tokenizer) -> None:
    """`auto` (transformers' tokenizer of an export) gives `tokenizer`'s ids (the run's: ByteTokenizer or an
    HFTokenizer) for 300 random texts (new ones each call) and ISSUE_TEXT, and its end and pad token are the run's
    end-of-document token, padding on the left."""
    for text in random_texts(np.random.default_rng(), 300):
        assert auto(text).input_ids == tokenizer.encode(text).tolist(), text
    assert auto.eos_token_id == auto.pad_token_id == tokenizer.eod and auto.padding_side == "left"
