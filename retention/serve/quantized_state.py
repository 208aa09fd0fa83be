"""Power-retention states quantized at rest: a snapshot's S and z as int8 (or packed 4-bit) with a bfloat16 scale
per row of the state (each of S's D rows of d values, each z row of D values), through the KV cache's quantizer
(retention/ops/attention/quantized.py: every value within scale / 2 of the original, a non-finite row stays
non-finite). The attention layers' caches and the rest of the snapshot are kept as they are; `dequantize_states`
gives back a float32 snapshot to continue from."""

import dataclasses
from typing import NamedTuple

import jax
from jaxtyping import Array, Float, Shaped

from retention.ops import RetentionState
from retention.ops.attention.quantized import dequantize, quantize
from retention.serve.snapshot import Snapshot
from retention.validation import check_choice


class QuantizedState(NamedTuple):
    """S [B, H, D, d] and z [B, H, D] quantized (int8, or uint8 holding two 4-bit values), a scale per row."""

    S: Shaped[Array, "B H D c"]
    S_scale: Float[Array, "B H D 1"]
    z: Shaped[Array, "B H c"]
    z_scale: Float[Array, "B H 1"]


def _is_state(x) -> bool:
    return isinstance(x, (RetentionState, QuantizedState))


def quantize_states(snapshot: Snapshot, bits: int = 8) -> Snapshot:
    """The snapshot with every RetentionState quantized to `bits` (8 or 4), a bfloat16 scale per row."""
    if not isinstance(snapshot, Snapshot):
        raise TypeError(f"snapshot must be a Snapshot (see retention.prefill), got {type(snapshot).__name__}")
    check_choice("bits", bits, (8, 4))

    def one(x):
        if not isinstance(x, RetentionState):
            return x
        (S, S_scale), (z, z_scale) = (quantize(a, bits, a.shape[-1]) for a in (x.S, x.z))
        return QuantizedState(S, S_scale, z, z_scale)

    return dataclasses.replace(snapshot, caches=jax.tree.map(one, snapshot.caches, is_leaf=_is_state))


def dequantize_states(snapshot: Snapshot) -> Snapshot:
    """The snapshot with every QuantizedState back in float32 (a RetentionState to continue from)."""
    one = lambda x: (
        RetentionState(dequantize(x.S, x.S_scale), dequantize(x.z, x.z_scale)) if isinstance(x, QuantizedState) else x
    )
    return dataclasses.replace(snapshot, caches=jax.tree.map(one, snapshot.caches, is_leaf=_is_state))
