"""Context parallelism for power retention: the sequence split over a mesh axis.

Device i of n holds tokens [i*T/n, (i+1)*T/n):
1. it forms its local state S_i = sum_j exp(G_end - G_j) phi(k_j) [v_j | 1]^T from an empty state (G the local
   cumulative log-gates; every exponent <= 0) and its total log-decay a_i = sum_j log_g_j;
2. the states combine as a gated exclusive prefix, the associative scan of (a, S) under
   (a_l, S_l) . (a_r, S_r) = (a_l + a_r, exp(a_r) S_l + S_r): a shift by one device, then Hillis-Steele rounds
   with `ppermute` (shift 1, 2, 4, ...), 1 + ceil(log2 n) rounds of one state each per device (an all_gather
   would move n - 1 states). A device that receives nothing gets zeros, the identity of the operator;
3. it runs the op on its tokens from the state entering it (the public `power_retention` with
   `initial_state`, so the Pallas kernels run where they would on one device: inside this shard_map every mesh
   axis is manual, and the kernels give their outputs the inputs' varying axes, `pallas_kernels/vma.py`).
Forward and gradients (JAX differentiates through `shard_map` and `ppermute`) equal the single-device op's to
rounding. Bytes per device per layer: (1 + ceil(log2 n)) * B*H*D*(d+1)*4, whatever T is.

The softmax baseline's counterpart gathers K and V instead (`attention/context_parallel.py`);
`experiments/comm_volume.py` tabulates both. Inside a model, `sequence_parallel_size()` reads the ambient mesh
(`jax.set_mesh`): the mixers switch to these ops when its "sequence" axis has more than one device.
"""

import jax
import jax.numpy as jnp
from einops import rearrange
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

from retention.ops.power_retention.chunk_math import gate_factors, state_write
from retention.ops.power_retention.op import power_retention
from retention.ops.power_retention.pallas import interpreted
from retention.ops.power_retention.state import RetentionState, augment, check_state, split
from retention.ops.power_retention.validation import (
    STATE_IMPLS,
    check_chunk_size,
    check_deg,
    check_log_g,
    default_chunk_size,
)
from retention.ops.sequence_parallel import SEQUENCE_AXIS, resolve_sequence_mesh
from retention.ops.validation import check_qkv, check_scale
from retention.validation import check_choice


def _local_state(k_BTHd, v_BTHd, log_g_BTH, deg: int, c: int):
    """This device's state from empty, [B, H, D, d+1] (z as the last column), and its total log-decay [B, H].

    Keys are discounted to the segment's end, exp((G_end - G_j) / deg) <= 1, and written chunk by chunk in a
    rematerialised scan (never a [T, D] feature map)."""
    T = k_BTHd.shape[1]
    f32 = jnp.float32
    G_BHT = jnp.cumsum(rearrange(log_g_BTH.astype(f32), "B T H -> B H T"), axis=-1)
    _, fk_BHT, _ = gate_factors(G_BHT, deg)
    k_f = k_BTHd.astype(f32) * rearrange(fk_BHT, "B H T -> B T H")[..., None]
    v_f = v_BTHd.astype(f32)
    v_aug = jnp.concatenate([v_f, jnp.ones(v_f.shape[:-1] + (1,), f32)], axis=-1)
    N = -(-T // c)
    pad = [(0, 0), (0, N * c - T), (0, 0), (0, 0)]  # zero keys write nothing
    k_NBHcd = rearrange(jnp.pad(k_f, pad), "B (N c) H d -> N B H c d", c=c)
    v_NBHce = rearrange(jnp.pad(v_aug, pad), "B (N c) H e -> N B H c e", c=c)
    S = state_write(k_NBHcd[0], v_NBHce[0], deg)  # the first chunk starts the carry (it varies over the mesh axes)
    if N > 1:  # (a scan of length 0 crashes XLA's CPU compiler under autodiff)
        body = jax.checkpoint(lambda S, kv: (S + state_write(*kv, deg), None))
        S, _ = jax.lax.scan(body, S, (k_NBHcd[1:], v_NBHce[1:]))
    return S, G_BHT[..., -1]


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
    the local op's, which runs from a state: one of STATE_IMPLS ("auto", "xla" or "pallas"). mesh: a Mesh, or
    None for the ambient one (`jax.set_mesh`); batch_axes: the mesh axes that split the batch (default: every
    other axis). T must be a multiple of the axis size, B of the batch axes' product. chunk_size None: the local
    op's default for T / n tokens.
    """
    check_qkv(q, k, v)
    check_deg(deg)
    check_log_g(log_g, k)
    check_scale(scale)
    check_choice("impl", impl, STATE_IMPLS)
    check_chunk_size(chunk_size)
    B, T, _, d = q.shape
    H = k.shape[2]
    if initial_state is not None:
        check_state(initial_state, B, H, d, deg, "initial_state")
    mesh, n, rows = resolve_sequence_mesh(mesh, axis, batch_axes, B, T)
    c = chunk_size or default_chunk_size(T // n)
    gated, has_init = log_g is not None, initial_state is not None
    log_g = jnp.zeros(k.shape[:3], jnp.float32) if log_g is None else log_g

    def local(q, k, v, log_g, S0_aug):
        S_loc, a_loc = _local_state(k, v, log_g, deg, c)
        a_before, S_in = _exclusive_prefix(a_loc, S_loc, axis, n)
        if has_init:  # the state from before the sequence, decayed over the devices before this one
            S_in = S_in + jnp.exp(a_before)[..., None, None] * S0_aug
        y, state = power_retention(
            q,
            k,
            v,
            log_g if gated else None,
            deg=deg,
            scale=scale,
            chunk_size=chunk_size,  # None: the local op's default (the kernels' own with impl="pallas")
            initial_state=split(S_in),
            return_state=True,
            impl=impl,
        )
        if not return_state:
            return y
        last = jax.lax.axis_index(axis) == n - 1  # the last device's final state is the sequence's
        return y, jax.lax.psum(jnp.where(last, augment(state), 0.0), axis)

    seq, rep = P(rows, axis, None, None), P(rows, None, None, None)
    S0 = augment(initial_state) if has_init else jnp.zeros((B, 1, 1, 1), jnp.float32)
    out_specs = (seq, rep) if return_state else seq
    specs = dict(in_specs=(seq, seq, seq, P(rows, axis, None), rep), out_specs=out_specs)
    run = jax.shard_map(local, mesh=mesh, check_vma=not interpreted(impl), **specs)
    out = run(q, k, v, log_g, S0)
    return (out[0], split(out[1])) if return_state else out
