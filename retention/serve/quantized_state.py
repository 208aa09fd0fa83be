"""Fixed-size states quantized, at rest (a snapshot's, in memory or in its file) and live (re-quantized after every
decode step): every recurrent state of an LM's caches (a power-retention layer's S and z, a matrix-state layer's
S: Gated DeltaNet, GLA, Mamba2) with a scale per row of the state (each of the last axis's rows: S's D rows of d values,
z's one row of D values). The attention layers' KV caches are kept as they are (they quantize through
kv_cache_bits), as is everything else in the snapshot.

Formats (STATE_FORMATS):
- 8 (int8) and 4 (two 4-bit values per uint8): the KV cache's quantizer (retention/ops/attention/quantized.py)
  with one group per row: q = round(x / s), s = max|x| / qmax rounded up to bfloat16, so every value is within
  s / 2 of the original (the bound a test checks);
- "fp8": float8_e4m3fn values x / s with a float32 scale s = max|x| / 448 (the format's largest value): a value
  within 2^-4 of its magnitude (3 mantissa bits, round to nearest) where x / s is normal (|x / s| >= 2^-6), within
  s 2^-10 (half the subnormal step 2^-9) below.
A non-finite row stays non-finite; a zero row stays zero.

`quantize_states` / `dequantize_states` turn a Snapshot's states into QuantizedArray leaves and back
(`quantize_caches` the same on an LMCache);
`round_trip_states(caches, state_format)` is the live form (`generate(..., state_format=...)`): each state
quantized and dequantized after every step, kept in float32 between steps (so it measures the error of a state
stored quantized, not the memory of one).
"""

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Float, Shaped

from retention.nn.matrix_state import MatrixStateCache
from retention.nn.power_retention import RetentionCache
from retention.ops import RetentionState
from retention.ops.attention.quantized import dequantize, quantize
from retention.serve.snapshot_value import Snapshot
from retention.validation import check_choice

STATE_FORMATS = (8, 4, "fp8")
FP8 = jnp.float8_e4m3fn
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


class QuantizedArray(NamedTuple):
    """A state array [..., r] quantized per row.

    Attributes:
        values: int8, packed 4-bit uint8 or float8_e4m3fn [..., r] (4-bit: [..., r / 2]).
        scale: a scale per row [..., 1]: bfloat16 for the integer formats, float32 for fp8.
    """

    values: Shaped[Array, "*b c"]
    scale: Float[Array, "*b 1"]


def quantize_rows(x: Float[Array, "*b r"], state_format) -> QuantizedArray:
    """x quantized with a scale per row (its last axis) in `state_format` (one of STATE_FORMATS)."""
    check_choice("state_format", state_format, STATE_FORMATS)
    if state_format != "fp8":
        return QuantizedArray(*quantize(x, state_format, x.shape[-1]))
    x = x.astype(jnp.float32)
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / FP8_MAX  # NaN or inf rows: a non-finite scale
    return QuantizedArray((x / jnp.where(scale == 0, 1.0, scale)).astype(FP8), scale)


def dequantize_rows(q: QuantizedArray) -> Float[Array, "*b r"]:
    """The float32 values of a QuantizedArray."""
    if q.values.dtype == FP8:
        return q.values.astype(jnp.float32) * q.scale
    return dequantize(q.values, q.scale)


def round_trip_rows(x: Float[Array, "*b r"], state_format) -> Float[Array, "*b r"]:
    """x quantized per row in `state_format` and dequantized again (float32)."""
    return dequantize_rows(quantize_rows(x, state_format))


def _map_states(caches, f):
    """The caches with f applied to every recurrent state array (RetentionState's S and z, MatrixStateCache's S)."""

    def one(layer):
        if isinstance(layer, RetentionCache):
            return layer._replace(state=RetentionState(f(layer.state.S), f(layer.state.z)))
        if isinstance(layer, MatrixStateCache):
            return layer._replace(state=f(layer.state))
        return layer

    return caches._replace(layers=tuple(one(layer) for layer in caches.layers))


def state_format_of(snapshot: Snapshot):
    """The format of the snapshot's quantized states (one of STATE_FORMATS), or None when they are float32."""
    found = {None}

    def note(x):
        if isinstance(x, QuantizedArray):
            found.add("fp8" if x.values.dtype == FP8 else 8 if x.values.dtype == jnp.int8 else 4)
        return x

    _map_states(snapshot.caches, note)
    return next(iter(found - {None}), None)


def quantize_caches(caches, state_format):
    """LMCache `caches` with every recurrent state a QuantizedArray in `state_format` (the rest as it is): what a
    store of quantized states holds, and under `jax.eval_shape` its bytes from shapes alone.

    Args:
        caches (LMCache): caches (`LM.init_caches`, `LM.prefill`) with float32 states, or their ShapeDtypeStructs.
        state_format (int | str): one of STATE_FORMATS (8, 4 or "fp8").

    Returns:
        (LMCache): the caches with each P layer's S and z and each matrix-state layer's S (D, G, M) quantized per row.
    """
    check_choice("state_format", state_format, STATE_FORMATS)
    return _map_states(caches, lambda x: quantize_rows(x, state_format))


def quantize_states(snapshot: Snapshot, state_format=8) -> Snapshot:
    """The snapshot with every recurrent state quantized per row.

    Args:
        snapshot: a snapshot with float32 states.
        state_format (int | str): 8, 4 or "fp8".

    Returns:
        The quantized snapshot (continue from it after `dequantize_states`).

    Raises:
        ValueError: the states are quantized already.
    """
    if not isinstance(snapshot, Snapshot):
        raise TypeError(f"snapshot must be a Snapshot (see retention.prefill), got {type(snapshot).__name__}")
    check_choice("state_format", state_format, STATE_FORMATS)
    if state_format_of(snapshot) is not None:
        raise ValueError(f"snapshot's states are quantized already ({state_format_of(snapshot)!r})")
    return dataclasses.replace(snapshot, caches=quantize_caches(snapshot.caches, state_format))


def dequantize_states(snapshot: Snapshot) -> Snapshot:
    """The snapshot with every quantized state back in float32, to continue from.

    Args:
        snapshot: a snapshot with quantized states (or float32 ones, returned as they are).

    Returns:
        The float32 snapshot.
    """
    back = lambda x: dequantize_rows(x) if isinstance(x, QuantizedArray) else x
    return dataclasses.replace(snapshot, caches=_map_states(snapshot.caches, back))


def round_trip_states(caches, state_format):
    """LMCache `caches` with every recurrent state quantized in `state_format` and dequantized again (float32):
    the state a decode step reads when the live state is stored quantized.

    Args:
        caches (LMCache): the caches.
        state_format (int | str): 8, 4 or "fp8".

    Returns:
        (LMCache): the caches with their states rounded through the format.
    """
    return _map_states(caches, lambda x: round_trip_rows(x, state_format))
