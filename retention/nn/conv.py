"""The short convolution as modules: `ShortConv` (one kernel over a flat [B, T, C] input, its decode cache of the
last K - 1 inputs) and `QKVConv` (one each on q, k and v, with their segment ids). The op is
`retention.ops.conv` (causal.py: the formula and the segment masking)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from retention.ops import sequence_parallel_size
from retention.ops.conv import causal_conv, causal_conv_context_parallel
from retention.validation import check_int


def check_conv_size(name: str, conv_size, *, low: int = 0) -> None:
    """conv_size is an int >= low (the config allows 0, off; a convolution needs at least 1 tap)."""
    check_int(name, conv_size, low=low)


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


def _next_ids(cache_ids_BP: Int[Array, "B P"], segment_ids_BT: Int[Array, "B T"] | None, T: int):
    """The segment ids of the last P inputs after T more (None: they continue the cache's last document)."""
    B, P = cache_ids_BP.shape
    if P == 0:
        return cache_ids_BP
    new_BT = jnp.broadcast_to(cache_ids_BP[:, -1:], (B, T)) if segment_ids_BT is None else segment_ids_BT
    return _last(jnp.concatenate([cache_ids_BP, new_BT.astype(jnp.int32)], axis=1), P)


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
        step, segment_ids None continues each row's document; a token's taps on the cache's inputs of another
        document are dropped."""
        convs, xs = (self.q, self.k, self.v), (q_BTC, k_BTC, v_BTC)
        if cache is None:
            (q, _), (k, _), (v, _) = (conv(x, segment_ids_BT=segment_ids_BT) for conv, x in zip(convs, xs))
            return q, k, v, None
        prefix_ids = None if segment_ids_BT is None else cache.segment_ids
        options = dict(segment_ids_BT=segment_ids_BT, cache_segment_ids_BP=prefix_ids)
        (q, cq), (k, ck), (v, cv) = (conv(x, cache=c, **options) for conv, x, c in zip(convs, xs, cache[:3]))
        return q, k, v, QKVConvCache(cq, ck, cv, _next_ids(cache.segment_ids, segment_ids_BT, q_BTC.shape[1]))

    def init_cache(self, batch: int, dtype=jnp.float32) -> QKVConvCache:
        """Zero inputs and segment ids 0: the state before the first token."""
        inputs = [conv.init_cache(batch, dtype) for conv in (self.q, self.k, self.v)]
        return QKVConvCache(*inputs, jnp.zeros((batch, self.q.conv_size - 1), jnp.int32))
