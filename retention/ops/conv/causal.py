"""The causal depthwise short convolution over time (the mixers' `conv_size` option, applied to q, k and v after
their projections, as in Based, Mamba, GLA and DeltaNet):

    y[t, c] = sum_{i < K} kernel[i, c] * x[t - (K - 1) + i, c]      (K = conv_size; kernel[K - 1] is the current token)

Tokens before the sequence are zeros, or the `prefix` of the K - 1 inputs that came before (a decode cache, or the
neighbouring device's last tokens). With `segment_ids [B, T]` (equal id = same document, documents contiguous in
time) a token never sees an input of another document: a tap with a change of id between it and the token is
dropped with `jnp.where` (so an id that comes back starts a fresh document, as in every op), and a NaN in one
document never reaches another. The prefix belongs to the document of token 0 unless its own ids say otherwise.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


@jax.custom_jvp
def _separate_cotangent(x):
    """The identity, whose cotangent is computed on its own on the CPU (its tangent passes through an optimization
    barrier, which transposes to one; other platforms: unchanged). Without it XLA CPU fuses the convolution's
    backward (K shifted, masked sums) into the transpose that the projection's weight gradient needs, a loop that
    reads five arrays in another layout: 13-20 ms for [128, 128, 64] where the sum and a plain transpose take ~4
    (experiments/PERF_LOG.md, 2026-12-01)."""
    return x


@_separate_cotangent.defjvp
def _separate_cotangent_jvp(primals, tangents):
    barrier = lambda t: jax.lax.platform_dependent(t, cpu=jax.lax.optimization_barrier, default=lambda t: t)
    return primals[0], barrier(tangents[0])


@jax.named_scope("causal_conv")
def causal_conv(
    x_BTC: Float[Array, "B T C"],
    kernel_KC: Float[Array, "K C"],
    *,
    prefix_BPC: Float[Array, "B P C"] | None = None,
    segment_ids_BT: Int[Array, "B T"] | None = None,
    prefix_segment_ids_BP: Int[Array, "B P"] | None = None,
) -> Float[Array, "B T C"]:
    """The causal depthwise convolution of x with one kernel per channel (module docstring), accumulated in float32
    (float64 for float64 x).

    Args:
        x_BTC: the inputs [B, T, C].
        kernel_KC: K taps per channel [K, C]; tap K - 1 multiplies the current token.
        prefix_BPC: the P = K - 1 inputs before x [B, K - 1, C]; None: zeros.
        segment_ids_BT: int [B, T]: taps that cross a document boundary are dropped. None: one document.
        prefix_segment_ids_BP: the prefix's ids [B, K - 1]; None: the prefix continues token 0's document.

    Returns:
        [B, T, C] in x's dtype.
    """
    K = kernel_KC.shape[0]
    B, T, C = x_BTC.shape
    x_BTC = _separate_cotangent(x_BTC)
    if prefix_BPC is None:
        prefix_BPC = jnp.zeros((B, K - 1, C), x_BTC.dtype)
    xp_BSC = jnp.concatenate([prefix_BPC.astype(x_BTC.dtype), x_BTC], axis=1)  # S = K - 1 + T
    if segment_ids_BT is not None and prefix_segment_ids_BP is None:
        prefix_segment_ids_BP = jnp.broadcast_to(segment_ids_BT[:, :1], (B, K - 1))
    if segment_ids_BT is not None:
        seg_BS = jnp.concatenate([prefix_segment_ids_BP.astype(segment_ids_BT.dtype), segment_ids_BT], axis=1)
    acc = jnp.promote_types(x_BTC.dtype, jnp.float32)  # float32, or float64 for float64 inputs
    kernel = kernel_KC.astype(acc)
    y_BTC = x_BTC.astype(acc) * kernel[K - 1]
    same_BT = None
    for i in reversed(range(K - 1)):  # tap i reads the input K - 1 - i tokens back: nearest first
        tap_BTC = xp_BSC[:, i : i + T].astype(acc)
        if segment_ids_BT is not None:  # no change of id between the tap and the token
            unchanged_BT = seg_BS[:, i : i + T] == seg_BS[:, i + 1 : i + 1 + T]
            same_BT = unchanged_BT if same_BT is None else same_BT & unchanged_BT
            tap_BTC = jnp.where(same_BT[..., None], tap_BTC, 0.0)
        y_BTC = y_BTC + tap_BTC * kernel[i]
    return y_BTC.astype(x_BTC.dtype)
