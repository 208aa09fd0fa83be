"""Context parallelism: the sequence split over a mesh axis, for power retention and for softmax attention.

Power retention (`power_retention_context_parallel`), device i of n holding tokens [i*T/n, (i+1)*T/n):
1. it forms its local state S_i = sum_j exp(G_end - G_j) phi(k_j) [v_j | 1]^T from an empty state (G the local
   cumulative log-gates; every exponent <= 0) and its total log-decay a_i = sum_j log_g_j;
2. the states combine as a gated exclusive prefix, the associative scan of (a, S) under
   (a_l, S_l) . (a_r, S_r) = (a_l + a_r, exp(a_r) S_l + S_r): a shift by one device, then Hillis-Steele rounds
   with `ppermute` (shift 1, 2, 4, ...), 1 + ceil(log2 n) rounds of one state each per device (an all_gather
   would move n - 1 states). A device that receives nothing gets zeros, the identity of the operator;
3. it runs the op on its tokens from the state entering it (the public `power_retention` with
   `initial_state`, so the Pallas kernels run where they would on one device).
Forward and gradients (JAX differentiates through `shard_map` and `ppermute`) equal the single-device op's to
rounding. Bytes per device per layer: (1 + ceil(log2 n)) * B*H*D*(d+1)*4, whatever T is.

Softmax attention (`softmax_attention_context_parallel`): each device gathers all K and V over the axis
(`all_gather`, (n-1)/n * T * H * d * 2 elements received per device: it grows with T) and attends its queries to
them with an online softmax over key blocks. `experiments/comm_volume.py` tabulates both.

Inside a model, `sequence_parallel_size()` reads the ambient mesh (`jax.set_mesh`): the mixers switch to these
ops when its "sequence" axis has more than one device.
"""

import math

import jax
import jax.numpy as jnp
from einops import rearrange
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

from retention.ops.attention import _acc_dtype, _allowed, _check_window
from retention.ops.chunked import _write
from retention.ops.power_retention import CHUNK_SIZES, _check_state, default_chunk_size, power_retention
from retention.ops.recurrent import RetentionState, augment, split
from retention.ops.validation import check_deg, check_log_g, check_qkv, check_scale

SEQUENCE_AXIS = "sequence"
IMPLS = ("auto", "xla", "pallas")


def sequence_parallel_size(axis: str = SEQUENCE_AXIS) -> int:
    """The size of `axis` in the ambient mesh (set by `jax.set_mesh`), 1 without a mesh or without that axis."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty or axis not in mesh.axis_names else mesh.shape[axis]


def _resolve(mesh, axis, batch_axes, B: int, T: int):
    """(mesh, n, batch spec entry) after checking the mesh, the axis and the divisibility of B and T."""
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    if mesh.empty:
        raise ValueError("mesh must be a jax.sharding.Mesh, or the call must run under jax.set_mesh(mesh); got none")
    if axis not in mesh.axis_names:
        raise ValueError(f"axis must name a mesh axis, one of {tuple(mesh.axis_names)}, got {axis!r}")
    n = mesh.shape[axis]
    if T % n:
        raise ValueError(f"the sequence length (q.shape[1]) must be a multiple of the mesh axis {axis!r} of size "
                         f"{n}, got T={T}")  # fmt: skip
    batch_axes = tuple(a for a in mesh.axis_names if a != axis) if batch_axes is None else tuple(batch_axes)
    if axis in batch_axes or set(batch_axes) - set(mesh.axis_names):
        raise ValueError(f"batch_axes must name mesh axes other than {axis!r}, got {batch_axes}")
    rows = math.prod(mesh.shape[a] for a in batch_axes)
    if B % rows:
        raise ValueError(f"the batch (q.shape[0]) must be a multiple of the mesh axes {batch_axes} of size {rows}, "
                         f"got B={B}")  # fmt: skip
    return mesh, n, (batch_axes or None)


def _local_state(k_BTHd, v_BTHd, log_g_BTH, deg: int, c: int):
    """This device's state from empty, [B, H, D, d+1] (z as the last column), and its total log-decay [B, H].

    Keys are discounted to the segment's end, exp((G_end - G_j) / deg) <= 1, and written chunk by chunk in a
    rematerialised scan (never a [T, D] feature map)."""
    B, T, H, d = k_BTHd.shape
    f32 = jnp.float32
    G = jnp.cumsum(log_g_BTH.astype(f32), axis=1)
    total_BH = G[:, -1]
    k_f = k_BTHd.astype(f32) * jnp.exp((total_BH[:, None] - G) / deg)[..., None]
    v_f = v_BTHd.astype(f32)
    v_aug = jnp.concatenate([v_f, jnp.ones(v_f.shape[:-1] + (1,), f32)], axis=-1)
    N = -(-T // c)
    pad = [(0, 0), (0, N * c - T), (0, 0), (0, 0)]  # zero keys write nothing
    k_NBHcd = rearrange(jnp.pad(k_f, pad), "B (N c) H d -> N B H c d", c=c)
    v_NBHce = rearrange(jnp.pad(v_aug, pad), "B (N c) H e -> N B H c e", c=c)
    S = _write(k_NBHcd[0], v_NBHce[0], deg)  # the first chunk starts the carry (it varies over the mesh axes)
    if N > 1:  # (a scan of length 0 crashes XLA's CPU compiler under autodiff)
        body = jax.checkpoint(lambda S, kv: (S + _write(*kv, deg), None))
        S, _ = jax.lax.scan(body, S, (k_NBHcd[1:], v_NBHce[1:]))
    return S, total_BH


def _exclusive_prefix(a_BH, S_aug, axis: str, n: int):
    """(sum of a over the devices before this one, the state entering this one): the exclusive scan of (a, S)
    over `axis` by ppermute, 1 + ceil(log2 n) rounds."""
    shift_to = lambda x, s: jax.lax.ppermute(x, axis, [(i, i + s) for i in range(n - s)])
    a, S = shift_to(a_BH, 1), shift_to(S_aug, 1)  # device i holds device i-1's segment; device 0 zeros
    s = 1
    while s < n:  # Hillis-Steele: after the round with shift s, device i covers segments i-2s .. i-1
        a_prev, S_prev = shift_to(a, s), shift_to(S, s)
        S = jnp.exp(a)[..., None, None] * S_prev + S
        a = a_prev + a
        s *= 2
    return a, S


def power_retention_context_parallel(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    log_g: Float[Array, "B T H"] | None = None,
    *,
    deg: int = 2,
    scale: float | None = None,
    chunk_size: int | None = None,
    initial_state: RetentionState | None = None,
    return_state: bool = False,
    impl: str = "auto",
    mesh=None,
    axis: str = SEQUENCE_AXIS,
    batch_axes: tuple[str, ...] | None = None,
):
    """`power_retention` with the sequence split over the mesh axis `axis` (see the module docstring).

    Same arguments, shapes and result as `power_retention` (y, or (y, state) with `return_state`); `impl` is
    the local op's ("auto", "xla" or "pallas"). mesh: a Mesh, or None for the ambient one (`jax.set_mesh`);
    batch_axes: the mesh axes that split the batch (default: every other axis). T must be a multiple of the
    axis size, B of the batch axes' product. chunk_size defaults to the single-device default of T / n.
    """
    check_qkv(q, k, v)
    check_deg(deg)
    check_log_g(log_g, k)
    check_scale(scale)
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS} for the context-parallel op, got {impl!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or chunk_size not in CHUNK_SIZES):
        raise ValueError(f"chunk_size must be None or one of {CHUNK_SIZES}, got {chunk_size!r}")
    B, T, _, d = q.shape
    H = k.shape[2]
    if initial_state is not None:
        _check_state(initial_state, B, H, d, deg, "initial_state")
    mesh, n, rows = _resolve(mesh, axis, batch_axes, B, T)
    c = chunk_size or default_chunk_size(T // n)
    gated, has_init = log_g is not None, initial_state is not None
    log_g = jnp.zeros(k.shape[:3], jnp.float32) if log_g is None else log_g

    def local(q, k, v, log_g, S0_aug):
        S_loc, a_loc = _local_state(k, v, log_g, deg, c)
        a_before, S_in = _exclusive_prefix(a_loc, S_loc, axis, n)
        if has_init:  # the state from before the sequence, decayed over the devices before this one
            S_in = S_in + jnp.exp(a_before)[..., None, None] * S0_aug
        y, state = power_retention(q, k, v, log_g if gated else None, deg=deg, scale=scale, chunk_size=c,
                                   initial_state=split(S_in), return_state=True, impl=impl)  # fmt: skip
        if not return_state:
            return y
        last = jax.lax.axis_index(axis) == n - 1  # the last device's final state is the sequence's
        return y, jax.lax.psum(jnp.where(last, augment(state), 0.0), axis)

    seq, rep = P(rows, axis, None, None), P(rows, None, None, None)
    S0 = augment(initial_state) if has_init else jnp.zeros((B, 1, 1, 1), jnp.float32)
    out_specs = (seq, rep) if return_state else seq
    run = jax.shard_map(local, mesh=mesh, in_specs=(seq, seq, seq, P(rows, axis, None), rep), out_specs=out_specs)
    out = run(q, k, v, log_g, S0)
    return (out[0], split(out[1])) if return_state else out


def _attend_gathered(q_BTHd, k_BSHd, v_BSHd, q_start, window, scale, block: int):
    """Queries at positions q_start + [0, T) against all S keys at positions [0, S), causal (and window): an
    online softmax over key blocks in a rematerialised scan. Returns [B, T, Hq, d] in v's dtype."""
    B, T, Hq, d = q_BTHd.shape
    S, H = k_BSHd.shape[1], k_BSHd.shape[2]
    acc = _acc_dtype(q_BTHd)
    b = min(block, S)
    N = -(-S // b)
    pad = [(0, 0), (0, N * b - S), (0, 0), (0, 0)]
    k_N = rearrange(jnp.pad(k_BSHd, pad), "B (N b) H d -> N B H b d", b=b)
    v_N = rearrange(jnp.pad(v_BSHd, pad), "B (N b) H d -> N B H b d", b=b)
    q_g = rearrange(q_BTHd.astype(acc) * scale, "B T (H g) d -> B H g T d", H=H)
    q_pos = (q_start + jnp.arange(T))[:, None]

    @jax.checkpoint
    def body(carry, xs):
        m, l, o = carry
        k_blk, v_blk, j = xs
        k_pos = (j * b + jnp.arange(b))[None, :]
        ok = _allowed(q_pos, k_pos, window) & (k_pos < S)
        s = jnp.where(ok, jnp.einsum("bhgtd,bhkd->bhgtk", q_g, k_blk.astype(acc)), -1e30)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        o = o * corr[..., None] + jnp.einsum("bhgtk,bhkd->bhgtd", p, v_blk.astype(acc))
        return (m_new, l * corr + p.sum(-1), o), None

    init = (jnp.full_like(q_g[..., 0], -1e30), jnp.zeros_like(q_g[..., 0]), jnp.zeros_like(q_g))  # q's varying axes
    (m, l, o), _ = jax.lax.scan(body, init, (k_N, v_N, jnp.arange(N)))
    return rearrange(o / l[..., None], "B H g T d -> B T (H g) d").astype(v_BSHd.dtype)


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
    `power_retention_context_parallel`."""
    check_qkv(q, k, v)
    check_scale(scale)
    _check_window(window)
    B, T, _, d = q.shape
    mesh, n, rows = _resolve(mesh, axis, batch_axes, B, T)
    scale = d**-0.5 if scale is None else float(scale)

    def local(q, k, v):
        k_all = jax.lax.all_gather(k, axis, axis=1, tiled=True)
        v_all = jax.lax.all_gather(v, axis, axis=1, tiled=True)
        start = jax.lax.axis_index(axis) * q.shape[1]
        return _attend_gathered(q, k_all, v_all, start, window, scale, block_size)

    seq = P(rows, axis, None, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(seq, seq, seq), out_specs=seq)(q, k, v)
