"""The causal depthwise short convolution over time (the mixers' `conv_size` option, applied to q, k and v after
their projections, as in Based, Mamba, GLA and DeltaNet):

    y[t, c] = sum_{i < K} kernel[i, c] * x[t - (K - 1) + i, c]      (K = conv_size; kernel[K - 1] is the current token)

Tokens before the sequence are zeros, or the `prefix` of the K - 1 inputs that came before (a decode cache, or the
neighbouring device's last tokens). With `segment_ids [B, T]` (equal id = same document, documents contiguous in
time) a token never sees an input of another document: a tap with a change of id between it and the token is
dropped with `jnp.where` (so an id that comes back starts a fresh document, as in every op), and a NaN in one
document never reaches another. The prefix belongs to the document of token 0 unless its own ids say otherwise.

Under a mesh whose "sequence" axis splits the tokens, `causal_conv_context_parallel` passes each device's last
K - 1 inputs (and their segment ids) to the next one with `ppermute` inside `shard_map`: the result equals one
device's.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float, Int

from retention.ops import sequence_parallel_size
from retention.ops.sequence_parallel import SEQUENCE_AXIS, resolve_sequence_mesh
from retention.validation import check_int


def check_conv_size(name: str, conv_size, *, low: int = 0) -> None:
    """conv_size is an int >= low (the config allows 0, off; a convolution needs at least 1 tap)."""
    check_int(name, conv_size, low=low)


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


def causal_conv(
    x_BTC: Float[Array, "B T C"],
    kernel_KC: Float[Array, "K C"],
    *,
    prefix_BPC: Float[Array, "B P C"] | None = None,
    segment_ids_BT: Int[Array, "B T"] | None = None,
    prefix_segment_ids_BP: Int[Array, "B P"] | None = None,
) -> Float[Array, "B T C"]:
    """The causal depthwise convolution of x [B, T, C] with kernel [K, C] (module docstring), accumulated in
    float32 (float64 for float64 x) and returned in x's dtype. prefix [B, K - 1, C]: the inputs before x (None:
    zeros). segment_ids: taps that cross a document boundary are dropped; prefix_segment_ids [B, K - 1] are the
    prefix's ids (None: the prefix continues token 0's document)."""
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


def causal_conv_context_parallel(
    x_BTC: Float[Array, "B T C"],
    kernel_KC: Float[Array, "K C"],
    *,
    segment_ids_BT: Int[Array, "B T"] | None = None,
    mesh=None,
    axis: str = SEQUENCE_AXIS,
) -> Float[Array, "B T C"]:
    """`causal_conv` with the tokens split over the mesh axis `axis` (mesh None: the ambient one): each device
    receives the previous device's last K - 1 inputs and segment ids by `ppermute` (device 0: zeros). Every
    device's share of T must hold at least K - 1 tokens."""
    K = kernel_KC.shape[0]
    B, T, _ = x_BTC.shape
    mesh, n, rows = resolve_sequence_mesh(mesh, axis, None, B, T)
    if T // n < K - 1:
        raise ValueError(
            f"conv_size={K} needs at least conv_size - 1 = {K - 1} tokens per device on the mesh axis {axis!r} of "
            f"size {n}, got T={T} ({T // n} per device)"
        )
    has_segments = segment_ids_BT is not None
    seg = segment_ids_BT if has_segments else jnp.zeros((B, T), jnp.int32)

    def local(x, seg, kernel):
        to_next = lambda a: jax.lax.ppermute(a, axis, [(i, i + 1) for i in range(n - 1)])
        tail = x[:, x.shape[1] - (K - 1) :]
        prefix = to_next(tail)
        if not has_segments:
            return causal_conv(x, kernel, prefix_BPC=prefix)
        prefix_seg = to_next(seg[:, seg.shape[1] - (K - 1) :])
        return causal_conv(x, kernel, prefix_BPC=prefix, segment_ids_BT=seg, prefix_segment_ids_BP=prefix_seg)

    seq = P(rows, axis, None)
    run = jax.shard_map(local, mesh=mesh, in_specs=(seq, P(rows, axis), P()), out_specs=seq)
    return run(x_BTC, seg, kernel_KC)


class ShortConv(nnx.Module):
    """A causal depthwise convolution of `conv_size` taps over `channels` channels: kernel [conv_size, channels]
    (no bias), initialised uniform in +-1/sqrt(conv_size) (PyTorch's Conv1d default for a depthwise filter). Its
    decode cache is the last conv_size - 1 inputs, [B, conv_size - 1, channels]."""

    def __init__(self, channels: int, conv_size: int, *, param_dtype=jnp.float32, rngs: nnx.Rngs):
        check_int("channels", channels)
        check_conv_size("conv_size", conv_size, low=1)
        self.conv_size = conv_size
        bound = conv_size**-0.5
        self.kernel = nnx.Param(
            jax.random.uniform(rngs.params(), (conv_size, channels), param_dtype, minval=-bound, maxval=bound)
        )

    def __call__(
        self,
        x_BTC: Float[Array, "B T C"],
        *,
        segment_ids_BT: Int[Array, "B T"] | None = None,
        cache: Float[Array, "B P C"] | None = None,
        cache_segment_ids_BP: Int[Array, "B P"] | None = None,
    ) -> tuple[Float[Array, "B T C"], Float[Array, "B P C"] | None]:
        """cache None: the full forward from zeros (context parallel under a mesh that splits the sequence),
        returning (y, None); else the T tokens continue the cache's inputs (of documents cache_segment_ids, None:
        token 0's): (y, the new cache)."""
        kernel = self.kernel[...]
        if cache is None:
            if sequence_parallel_size() > 1:
                return causal_conv_context_parallel(x_BTC, kernel, segment_ids_BT=segment_ids_BT), None
            return causal_conv(x_BTC, kernel, segment_ids_BT=segment_ids_BT), None
        y = causal_conv(
            x_BTC, kernel, prefix_BPC=cache, segment_ids_BT=segment_ids_BT, prefix_segment_ids_BP=cache_segment_ids_BP
        )
        return y, _last(jnp.concatenate([cache, x_BTC.astype(cache.dtype)], axis=1), self.conv_size - 1)

    def init_cache(self, batch: int, dtype=jnp.float32) -> Float[Array, "B P C"]:
        """Zeros [batch, conv_size - 1, channels]: the inputs before the first token."""
        check_int("batch", batch)
        return jnp.zeros((batch, self.conv_size - 1, self.kernel.shape[1]), dtype)


def _last(x_BS, n: int):
    """The last n entries along axis 1 (n may be 0)."""
    return x_BS[:, x_BS.shape[1] - n :]


def _step_ids(cache_ids_BP: Int[Array, "B P"], segment_ids_BT: Int[Array, "B T"] | None, T: int):
    """The segment ids of a step's T tokens: as given, or (None) each row's last document in the cache (conv_size
    1 keeps no inputs: the ids are never read)."""
    if segment_ids_BT is not None:
        return segment_ids_BT.astype(jnp.int32)
    B, P = cache_ids_BP.shape
    return jnp.zeros((B, T), jnp.int32) if P == 0 else jnp.broadcast_to(cache_ids_BP[:, -1:], (B, T))


class QKVConvCache(NamedTuple):
    """The last conv_size - 1 projected inputs of q [B, K-1, Hq*d], k and v [B, K-1, H*d], and their segment ids
    [B, K-1] (0 before the first token)."""

    q: Float[Array, "B P Cq"]
    k: Float[Array, "B P Ck"]
    v: Float[Array, "B P Ck"]
    segment_ids: Int[Array, "B P"]


class QKVConv(nnx.Module):
    """`ShortConv` on each of q, k and v (flat [B, T, heads * head_dim]), one kernel each."""

    def __init__(self, q_channels: int, kv_channels: int, conv_size: int, *, param_dtype=jnp.float32, rngs):
        conv = lambda c: ShortConv(c, conv_size, param_dtype=param_dtype, rngs=rngs)
        self.q, self.k, self.v = conv(q_channels), conv(kv_channels), conv(kv_channels)

    def __call__(self, q_BTC, k_BTC, v_BTC, *, segment_ids_BT=None, cache: QKVConvCache | None = None):
        """(q, k, v convolved, the new QKVConvCache or None): the full forward (cache None) or a decode step. In a
        step, segment_ids None continues each row's last document in the cache; a token's taps on the cache's
        inputs of another document are dropped."""
        convs, xs = (self.q, self.k, self.v), (q_BTC, k_BTC, v_BTC)
        if cache is None:
            (q, _), (k, _), (v, _) = (conv(x, segment_ids_BT=segment_ids_BT) for conv, x in zip(convs, xs))
            return q, k, v, None
        ids_BT = _step_ids(cache.segment_ids, segment_ids_BT, q_BTC.shape[1])
        options = dict(segment_ids_BT=ids_BT, cache_segment_ids_BP=cache.segment_ids)
        (q, cq), (k, ck), (v, cv) = (conv(x, cache=c, **options) for conv, x, c in zip(convs, xs, cache[:3]))
        next_ids = _last(jnp.concatenate([cache.segment_ids, ids_BT], axis=1), cache.segment_ids.shape[1])
        return q, k, v, QKVConvCache(cq, ck, cv, next_ids)

    def init_cache(self, batch: int, dtype=jnp.float32) -> QKVConvCache:
        """Zero inputs and segment ids 0: the state before the first token."""
        inputs = [conv.init_cache(batch, dtype) for conv in (self.q, self.k, self.v)]
        return QKVConvCache(*inputs, jnp.zeros((batch, self.q.conv_size - 1), jnp.int32))
