"""Shared by the lm-eval adapter's tests: the tiny LM's config (2 layers, P then A, d_model 32, the byte
tokenizer's 257 ids) and the oracle: a full forward at one padded shape (one compile; logits at t depend only on
tokens <= t, tests/nn/test_model.py) with log_softmax in float64."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from retention.nn import LM, LMConfig

CONFIG = LMConfig(vocab_size=257, d_model=32, n_layers=2, pattern="PA", n_heads=4, n_kv_heads=2, head_dim=8)
MAX_LENGTH, BATCH = 32, 4
ORACLE_LEN = 64  # every oracle forward runs [1, ORACLE_LEN], the sequence right-padded


class Oracle:
    """Log-probabilities and greedy tokens of the tiny LM, one full forward per question."""

    def __init__(self, model: LM):
        self.model, self.forward = model, nnx.jit(lambda m, t: m(t))

    def logp(self, ids: list[int]) -> np.ndarray:
        """[len(ids), V] float64: log p(next token | ids[: t + 1]) at each t."""
        assert 1 <= len(ids) <= ORACLE_LEN
        padded = np.zeros((1, ORACLE_LEN), np.int32)
        padded[0, : len(ids)] = ids
        logits = np.asarray(self.forward(self.model, jnp.asarray(padded)))[0, : len(ids)].astype(np.float64)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))

    def score(self, inputs: list[int], targets: list[int]) -> tuple[float, bool]:
        """(sum of log p(targets), all argmax) where the targets follow the last len(targets) inputs."""
        logp = self.logp(inputs)[len(inputs) - len(targets) :]
        picked = logp[np.arange(len(targets)), targets]
        return float(picked.sum()), bool(np.all(logp.argmax(axis=-1) == np.asarray(targets)))

    def greedy(self, ids: list[int], n: int) -> list[int]:
        """n tokens, each the argmax of a full forward of the ids before it."""
        ids = list(ids)
        for _ in range(n):
            ids.append(int(self.logp(ids)[-1].argmax()))
        return ids[-n:]
