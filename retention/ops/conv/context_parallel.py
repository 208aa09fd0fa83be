"""The short convolution under a mesh whose "sequence" axis splits the tokens: each device passes its last K - 1
inputs (and their segment ids) to the next one with `ppermute` inside `shard_map`, so the result equals one
device's `causal_conv`. A "tensor" axis of size t > 1 splits the channels (and the kernel's) into t contiguous
blocks (`context_mesh.heads_axis`): the mixers' channels are heads * head_dim head-major (q [B, T, Hq * d] is
reshaped to [B, T, Hq, d]), so each block is whole heads, where the tensor rules put the projections' outputs."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float, Int

from retention.ops.context_mesh import SEQUENCE_AXIS, heads_axis, resolve_sequence_mesh
from retention.ops.conv.causal import causal_conv


def causal_conv_context_parallel(
    x_BTC: Float[Array, "B T C"],
    kernel_KC: Float[Array, "K C"],
    *,
    segment_ids_BT: Int[Array, "B T"] | None = None,
    mesh=None,
    axis: str = SEQUENCE_AXIS,
) -> Float[Array, "B T C"]:
    """`causal_conv` with the tokens split over the mesh axis `axis`: each device receives the previous device's
    last K - 1 inputs and segment ids by `ppermute` (device 0: zeros).

    Args:
        x_BTC: the inputs [B, T, C]; every device's share of T must hold at least K - 1 tokens.
        kernel_KC: the taps [K, C].
        segment_ids_BT: int [B, T] or None, as in `causal_conv`.
        mesh (Mesh | None): the device mesh, or None for the ambient one. A "tensor" axis splits the channels, so its
            size must divide C.
        axis: the mesh axis that splits the sequence.

    Returns:
        [B, T, C] in x's dtype.
    """
    K = kernel_KC.shape[0]
    B, T, C = x_BTC.shape
    mesh, n, rows = resolve_sequence_mesh(mesh, axis, None, B, T)
    heads = heads_axis(mesh, axis, rows, {"x_BTC.shape[2] (channels, heads * head_dim)": C})
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

    seq = P(rows, axis, heads)
    run = jax.shard_map(local, mesh=mesh, in_specs=(seq, P(rows, axis), P(None, heads)), out_specs=seq)
    return run(x_BTC, seg, kernel_KC)
