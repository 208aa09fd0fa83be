"""Context parallelism for softmax attention: the sequence split over a mesh axis, K and V gathered.

Each device gathers all K and V over the axis (`all_gather`, (n-1)/n * T * H * d * 2 elements received per device:
it grows with T; with segment_ids, the ids too) and attends its own queries to them with the online softmax over
key blocks (`scores.online_softmax_update`, as the blockwise kernel). Power retention's counterpart exchanges fixed-size
states instead (`power_retention/context_parallel.py`); `experiments/comm_volume.py` tabulates both.

A "tensor" axis of size t > 1 in the mesh splits the heads too (`context_mesh.heads_axis`): each device holds a
contiguous block of Hq/t query heads and their H/t kv-heads, and gathers only those K and V (t must divide H).
"""

import jax
import jax.numpy as jnp
from einops import rearrange
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float, Int

from retention.ops.attention.scores import MASKED, acc_dtype, online_softmax_update, poison_nonfinite, visible
from retention.ops.attention.validation import check_window
from retention.ops.context_mesh import SEQUENCE_AXIS, heads_axis, resolve_sequence_mesh
from retention.ops.segments import document_index
from retention.ops.validation import check_qkv, check_scale, check_segment_ids, runtime_input_checks
from retention.validation import check_at_runtime, check_int


def _attend_gathered(q_BTHd, k_BSHd, v_BSHd, q_seg_BT, k_seg_BS, q_start, window, scale, block: int):
    """Queries at positions q_start + [0, T) against all S keys at positions [0, S), causal (and window), each
    query only to keys of its own segment: the online softmax over key blocks in a rematerialised scan. Returns
    [B, T, Hq, d] in v's dtype."""
    T = q_BTHd.shape[1]
    S, H = k_BSHd.shape[1], k_BSHd.shape[2]
    acc = acc_dtype(q_BTHd)
    b = min(block, S)
    N = -(-S // b)
    pad = [(0, 0), (0, N * b - S), (0, 0), (0, 0)]
    k_N = rearrange(jnp.pad(k_BSHd, pad), "B (N b) H d -> N B H b d", b=b)
    v_N = rearrange(jnp.pad(v_BSHd, pad), "B (N b) H d -> N B H b d", b=b)
    seg_N = rearrange(jnp.pad(k_seg_BS, [(0, 0), (0, N * b - S)]), "B (N b) -> N B b", b=b)
    q_g = rearrange(q_BTHd.astype(acc) * scale, "B T (H g) d -> B H g T d", H=H)
    q_pos = (q_start + jnp.arange(T))[:, None]

    @jax.checkpoint
    def body(carry, xs):
        k_blk, v_blk, seg_blk, j = xs
        k_pos = (j * b + jnp.arange(b))[None, :]
        ok = visible(q_pos, k_pos, window, q_seg_BT[:, :, None], seg_blk[:, None, :]) & (k_pos < S)
        ok = ok[:, None, None]  # [B, 1, 1, T, b]
        s = jnp.where(ok, jnp.einsum("bhgtd,bhkd->bhgtk", q_g, k_blk.astype(acc)), MASKED)
        return online_softmax_update(carry, s, ok, v_blk[:, :, None]), None

    init = (jnp.full_like(q_g[..., 0], MASKED), jnp.zeros_like(q_g[..., 0]), jnp.zeros_like(q_g))  # q's varying axes
    (_, den, o), _ = jax.lax.scan(body, init, (k_N, v_N, seg_N, jnp.arange(N)))
    return rearrange(o / den[..., None], "B H g T d -> B T (H g) d").astype(v_BSHd.dtype)


@jax.named_scope("softmax_attention_context_parallel")
def softmax_attention_context_parallel(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    *,
    window: int | None = None,
    segment_ids: Int[Array, "B T"] | None = None,
    scale: float | None = None,
    mesh=None,
    axis: str = SEQUENCE_AXIS,
    batch_axes: tuple[str, ...] | None = None,
    block_size: int = 512,
    debug_checks: bool = False,
) -> Float[Array, "B T Hq d"]:
    """`softmax_attention` with the sequence split over the mesh axis `axis`: K, V and segment ids are
    all-gathered over it, each device attends its own queries.

    Args:
        q: queries [B, T, Hq, d].
        k: keys [B, T, H, d].
        v: values [B, T, H, d].
        window: as in `softmax_attention`.
        segment_ids: int [B, T] or None, as in `softmax_attention`.
        scale: None is d^-0.5.
        mesh (Mesh | None): the device mesh, or None for the ambient one (`jax.set_mesh`).
        axis: the mesh axis that splits the sequence.
        batch_axes: as in `power_retention_context_parallel` (a "tensor" axis splits the heads).
        block_size: keys per online-softmax step.
        debug_checks: as in `softmax_attention`.

    Returns:
        y [B, T, Hq, d] in v's dtype.
    """
    check_qkv(q, k, v)
    check_scale(scale)
    check_window(window)
    check_segment_ids(segment_ids, *q.shape[:2])
    check_int("block_size", block_size)
    B, T, _, d = q.shape
    mesh, n, rows = resolve_sequence_mesh(mesh, axis, batch_axes, B, T)
    heads = heads_axis(mesh, axis, rows, {"q.shape[2] (query heads)": q.shape[2], "k.shape[2] (kv heads)": k.shape[2]})
    if debug_checks:
        check_at_runtime(runtime_input_checks({"q": q, "k": k, "v": v}, segment_ids))
    scale = d**-0.5 if scale is None else float(scale)
    packed = segment_ids is not None

    def local(q, k, v, *seg):  # seg: (segment ids,) when packed
        q, k, v = poison_nonfinite(q, k, v)
        gather = lambda x: jax.lax.all_gather(x, axis, axis=1, tiled=True)
        seg = seg[0] if packed else jnp.zeros(q.shape[:2], jnp.int32)  # unpacked: nothing more to gather
        seg_all = gather(seg) if packed else jnp.zeros((q.shape[0], q.shape[1] * n), jnp.int32)
        start = jax.lax.axis_index(axis) * q.shape[1]
        return _attend_gathered(q, gather(k), gather(v), seg, seg_all, start, window, scale, block_size)

    seq = P(rows, axis, heads, None)
    in_specs = (seq, seq, seq) + ((P(rows, axis),) if packed else ())
    args = (q, k, v) + ((document_index(segment_ids),) if packed else ())  # a returning id: a new document
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=seq)(*args)
