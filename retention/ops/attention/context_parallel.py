"""Context parallelism for softmax attention: the sequence split over a mesh axis, K and V gathered.

Each device gathers all K and V over the axis (`all_gather`, (n-1)/n * T * H * d * 2 elements received per device:
it grows with T) and attends its own queries to them with the online softmax over key blocks
(`scores.online_softmax_update`, as the blockwise kernel). Power retention's counterpart exchanges fixed-size
states instead (`power_retention/context_parallel.py`); `experiments/comm_volume.py` tabulates both.
"""

import jax
import jax.numpy as jnp
from einops import rearrange
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

from retention.ops.attention.scores import MASKED, acc_dtype, online_softmax_update, visible
from retention.ops.attention.validation import check_window
from retention.ops.sequence_parallel import SEQUENCE_AXIS, resolve_sequence_mesh
from retention.ops.validation import check_qkv, check_scale
from retention.validation import check_int


def _attend_gathered(q_BTHd, k_BSHd, v_BSHd, q_start, window, scale, block: int):
    """Queries at positions q_start + [0, T) against all S keys at positions [0, S), causal (and window): the
    online softmax over key blocks in a rematerialised scan. Returns [B, T, Hq, d] in v's dtype."""
    T = q_BTHd.shape[1]
    S, H = k_BSHd.shape[1], k_BSHd.shape[2]
    acc = acc_dtype(q_BTHd)
    b = min(block, S)
    N = -(-S // b)
    pad = [(0, 0), (0, N * b - S), (0, 0), (0, 0)]
    k_N = rearrange(jnp.pad(k_BSHd, pad), "B (N b) H d -> N B H b d", b=b)
    v_N = rearrange(jnp.pad(v_BSHd, pad), "B (N b) H d -> N B H b d", b=b)
    q_g = rearrange(q_BTHd.astype(acc) * scale, "B T (H g) d -> B H g T d", H=H)
    q_pos = (q_start + jnp.arange(T))[:, None]

    @jax.checkpoint
    def body(carry, xs):
        k_blk, v_blk, j = xs
        k_pos = (j * b + jnp.arange(b))[None, :]
        ok = visible(q_pos, k_pos, window) & (k_pos < S)
        s = jnp.where(ok, jnp.einsum("bhgtd,bhkd->bhgtk", q_g, k_blk.astype(acc)), MASKED)
        return online_softmax_update(carry, s, ok, v_blk[:, :, None]), None

    init = (jnp.full_like(q_g[..., 0], MASKED), jnp.zeros_like(q_g[..., 0]), jnp.zeros_like(q_g))  # q's varying axes
    (_, den, o), _ = jax.lax.scan(body, init, (k_N, v_N, jnp.arange(N)))
    return rearrange(o / den[..., None], "B H g T d -> B T (H g) d").astype(v_BSHd.dtype)


def softmax_attention_context_parallel(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    *,
    window: int | None = None,
    scale: float | None = None,
    mesh=None,
    axis: str = SEQUENCE_AXIS,
    batch_axes: tuple[str, ...] | None = None,
    block_size: int = 512,
) -> Float[Array, "B T Hq d"]:
    """`softmax_attention` (causal, full or sliding window) with the sequence split over the mesh axis `axis`:
    K and V are all-gathered over it, each device attends its own queries. mesh and batch_axes as in
    `power_retention_context_parallel`; block_size: keys per online-softmax step."""
    check_qkv(q, k, v)
    check_scale(scale)
    check_window(window)
    check_int("block_size", block_size)
    B, T, _, d = q.shape
    mesh, _, rows = resolve_sequence_mesh(mesh, axis, batch_axes, B, T)
    scale = d**-0.5 if scale is None else float(scale)

    def local(q, k, v):
        k_all = jax.lax.all_gather(k, axis, axis=1, tiled=True)
        v_all = jax.lax.all_gather(v, axis, axis=1, tiled=True)
        start = jax.lax.axis_index(axis) * q.shape[1]
        return _attend_gathered(q, k_all, v_all, start, window, scale, block_size)

    seq = P(rows, axis, None, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(seq, seq, seq), out_specs=seq)(q, k, v)
