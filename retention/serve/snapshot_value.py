"""The Snapshot value: an LM's caches after a prompt and the logits of its last token, with the config, weights
digest and cache shapes they came from. What is done with one (prefill, extend, fork, check, save, load) is in
snapshot.py; its quantized states are quantized_state.py's."""

import dataclasses
from functools import partial

import jax
from jaxtyping import Array, Float

from retention.nn import LMCache, LMConfig


@partial(
    jax.tree_util.register_dataclass,
    data_fields=("caches", "logits"),
    meta_fields=("config", "weights_digest", "max_len", "step_tokens"),
)
@dataclasses.dataclass(frozen=True)
class Snapshot:
    """An LM's caches after a prompt: a value to keep, fork, save and continue (`prefill`).

    Attributes:
        caches: the LMCache, B rows.
        logits: each row's last token's logits [B, V], float32.
        config: the model's LMConfig (static).
        weights_digest: sha256 of the weights' checksums (static).
        max_len: the caches were made for up to max_len tokens in all (static).
        step_tokens: and decoded in steps of up to step_tokens (static).
    """

    caches: LMCache
    logits: Float[Array, "B V"]
    config: LMConfig
    weights_digest: str
    max_len: int
    step_tokens: int

    @property
    def rows(self) -> int:
        """The snapshot's rows (B)."""
        return self.logits.shape[0]
