"""The short convolution as modules: `ShortConv` (one kernel over a flat [B, T, C] input, its decode cache of the
last K - 1 inputs) and `QKVConv` (one each on q, k and v, with their segment ids). The op is
`retention.ops.conv` (causal.py: the formula and the segment masking)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from retention.ops import context_parallel_size
from retention.ops.conv import causal_conv, causal_conv_context_parallel
from retention.parallel.rules import logical_param
from retention.validation import check_int


def check_conv_size(name: str, conv_size, *, low: int = 0) -> None:
    """conv_size is an int >= low (the config allows 0, off; a convolution needs at least 1 tap)."""
    check_int(name, conv_size, low=low)


class ShortConv(nnx.Module):
    """A causal depthwise convolution of `conv_size` taps over `channels` channels: kernel [conv_size, channels]
    (no bias), initialised uniform in +-1/sqrt(conv_size) (PyTorch's Conv1d default for a depthwise filter). Its
    decode cache is the last conv_size - 1 inputs, [B, conv_size - 1, channels]. `channel_axis`: the channels'
    logical axis (the kernel is ("conv_taps", channel_axis)); None: unnamed, replicated."""

    def __init__(
        self, channels: int, conv_size: int, *, channel_axis: str | None = None, param_dtype=jnp.float32, rngs: nnx.Rngs
    ):
        check_int("channels", channels)
        check_conv_size("conv_size", conv_size, low=1)
        self.conv_size = conv_size
        bound = conv_size**-0.5
        self.kernel = nnx.Param(
            jax.random.uniform(rngs.params(), (conv_size, channels), param_dtype, minval=-bound, maxval=bound),
            **logical_param("conv_taps", channel_axis),
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
            if context_parallel_size() > 1:
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
    """`ShortConv` on each of q, k and v (flat [B, T, heads * head_dim]), one kernel each; `channel_axes`: the
    logical axes of q's channels and of k's and v's."""

    def __init__(
        self, q_channels: int, kv_channels: int, conv_size: int, channel_axes, *, param_dtype=jnp.float32, rngs
    ):
        conv = lambda c, axis: ShortConv(c, conv_size, channel_axis=axis, param_dtype=param_dtype, rngs=rngs)
        q_axis, kv_axis = channel_axes
        self.q, self.k, self.v = conv(q_channels, q_axis), conv(kv_channels, kv_axis), conv(kv_channels, kv_axis)

    def __call__(self, q_BTC, k_BTC, v_BTC, *, segment_ids_BT=None, cache: QKVConvCache | None = None):
        """(q, k, v convolved, the new QKVConvCache or None): the full forward (cache None) or a decode step. In a
        step, segment_ids None continues each row's last document in the cache; a token's taps on the cache's
        inputs of another document are dropped."""
        convs, xs = (self.q, self.k, self.v), (q_BTC, k_BTC, v_BTC)
        if cache is None:
            (q, _), (k, _), (v, _) = (conv(x, segment_ids_BT=segment_ids_BT) for conv, x in zip(convs, xs))
            return q, k, v, None
        ids_BT = _step_ids(cache.segment_ids, segment_ids_BT, q_BTC.shape[1])
        (q, cq), (k, ck), (v, cv) = (
            conv(x, cache=c, segment_ids_BT=ids_BT, cache_segment_ids_BP=cache.segment_ids)
            for conv, x, c in zip(convs, xs, cache[:3])
        )
        next_ids = _last(jnp.concatenate([cache.segment_ids, ids_BT], axis=1), cache.segment_ids.shape[1])
        return q, k, v, QKVConvCache(cq, ck, cv, next_ids)

    def per_token_caches(self, q_BTC, k_BTC, v_BTC, *, segment_ids_BT=None, cache: QKVConvCache) -> QKVConvCache:
        """The conv cache after each of the T step inputs (unconvolved q, k, v), stacked: every field [T, ...],
        entry i the cache a step of tokens 0..i leaves (its last conv_size - 1 inputs and their ids)."""
        T, P = q_BTC.shape[1], cache.segment_ids.shape[1]
        ids_BT = _step_ids(cache.segment_ids, segment_ids_BT, T)
        window_TP = jnp.arange(1, T + 1)[:, None] + jnp.arange(P)[None, :]  # after token i: inputs i + 1 .. i + P
        after = lambda old, new: jnp.moveaxis(jnp.concatenate([old, new.astype(old.dtype)], axis=1)[:, window_TP], 1, 0)
        return QKVConvCache(*(after(c, x) for c, x in zip(cache, (q_BTC, k_BTC, v_BTC, ids_BT))))

    def init_cache(self, batch: int, dtype=jnp.float32) -> QKVConvCache:
        """Zero inputs and segment ids 0: the state before the first token."""
        inputs = [conv.init_cache(batch, dtype) for conv in (self.q, self.k, self.v)]
        return QKVConvCache(*inputs, jnp.zeros((batch, self.q.conv_size - 1), jnp.int32))
