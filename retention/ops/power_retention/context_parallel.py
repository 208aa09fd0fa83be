"""Context parallelism for power retention: the sequence split over a mesh axis.

Device i of n holds tokens [i*T/n, (i+1)*T/n):
1. it forms its local state S_i from an empty state, chunk by chunk with the reset contract (`gates.chunk_gates`,
   `chunk_math`: keys after the last reset, discounted to the segment's end), its total log-decay a_i (the sum
   of its gates) and whether it resets r_i (a -inf gate or a document start among its tokens);
2. the states combine as a gated exclusive prefix, the associative scan of (a, r, S) under
   (a_l, r_l, S_l) . (a_r, r_r, S_r) = (a_l + a_r, r_l or r_r, S_r if r_r else exp(a_r) S_l + S_r)
   (`decay.combine_decayed`, shared with linear attention and GLA): `context_mesh.exclusive_scan`, a shift by
   one device, then Hillis-Steele rounds with `ppermute` (shift 1, 2, 4, ...), 1 + ceil(log2 n) rounds of one
   state each per device (an all_gather would move n - 1 states). A device that receives nothing gets zeros, the
   identity of the operator;
3. it runs the op on its tokens from the state entering it (the public `power_retention` with
   `initial_state` and its part of segment_ids, so the Pallas kernels run where they would on one device: inside
   this shard_map every mesh axis is manual, and the kernels give their outputs the inputs' varying axes,
   `pallas_kernels/vma.py`); a device whose first token starts a document starts from an empty state.
Forward and gradients (JAX differentiates through `shard_map` and `ppermute`) equal the single-device op's to
rounding. Bytes per device per layer: (1 + ceil(log2 n)) * B*H*D*(d+1)*4, whatever T is.

Under a mesh with a "tensor" axis of size t > 1 (tensor parallelism; `context_mesh.heads_axis`) the shard_map also
splits the heads over it: each device holds Hq/t query heads, H/t kv-heads (a contiguous block each, so GQA's
query head i -> kv-head i // (Hq/H) stays on the device), their gates and their slice of the initial and returned
states, and every step above runs on its own heads only (the states exchanged shrink by t too). t must divide H.

The softmax baseline's counterpart gathers K and V instead (`attention/context_parallel.py`);
`experiments/comm_volume.py` tabulates both. Inside a model, `context_parallel_size()` reads the ambient mesh
(`jax.set_mesh`): the mixers switch to these ops when its "sequence" axis has more than one device.
"""

import jax
import jax.numpy as jnp
from einops import rearrange
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float, Int

from retention.ops.chunking import default_chunk_size
from retention.ops.context_mesh import SEQUENCE_AXIS, exclusive_scan, heads_axis, resolve_sequence_mesh
from retention.ops.decay import combine_decayed, decay_state, gate_factors
from retention.ops.power_retention.chunk_math import state_write
from retention.ops.power_retention.gates import chunk_gates
from retention.ops.power_retention.op import power_retention, run_debug_checks
from retention.ops.power_retention.pallas import interpreted
from retention.ops.power_retention.state import RetentionState, augment, check_state, split, with_ones
from retention.ops.power_retention.validation import STATE_IMPLS, check_op_args
from retention.ops.segments import document_starts


def _local_state(k_BTHd, v_BTHd, log_g_BTH, segment_ids_BT, deg: int, c: int):
    """This device's state from empty, [B, H, D, d+1] (z as the last column), its total log-decay [B, H] and
    whether it resets [B, H] (at a -inf gate or a document start after its first token).

    Per chunk the keys after its last reset are discounted to its end, exp((F_end - F_j) / deg) <= 1, and the
    carried state decays by the chunk's gates (dropped at a reset), in a rematerialised scan (never a [T, D]
    feature map)."""
    f32 = jnp.float32
    gates = chunk_gates(k_BTHd, v_BTHd, log_g_BTH, segment_ids_BT, chunk_size=c)
    _, fk_BNHc, decay_BNH = gate_factors(gates.F, gates.R, deg)
    N = gates.F.shape[1]
    pad = [(0, 0), (0, N * c - k_BTHd.shape[1]), (0, 0), (0, 0)]  # zero keys write nothing
    v_f = jnp.pad(gates.v.astype(f32), pad)
    v_aug = with_ones(v_f)
    k_NBHcd = rearrange(jnp.pad(gates.k.astype(f32), pad), "B (N c) H d -> N B H c d", c=c)
    k_NBHcd = k_NBHcd * rearrange(fk_BNHc, "B N H c -> N B H c")[..., None]
    v_NBHce = rearrange(v_aug, "B (N c) H e -> N B H c e", c=c)
    decay_NBH = rearrange(decay_BNH, "B N H -> N B H")
    S = state_write(k_NBHcd[0], v_NBHce[0], deg)  # the first chunk starts the carry (it varies over the mesh axes)
    if N > 1:  # (a scan of length 0 crashes XLA's CPU compiler under autodiff)
        body = jax.checkpoint(lambda S, xs: (decay_state(xs[2], S) + state_write(xs[0], xs[1], deg), None))
        S, _ = jax.lax.scan(body, S, (k_NBHcd[1:], v_NBHce[1:], decay_NBH[1:]))
    resets = gates.R[..., -1].sum(axis=1) > 0  # [B, H]
    return S, gates.F[..., -1].sum(axis=1), resets


@jax.named_scope("power_retention_context_parallel")
def power_retention_context_parallel(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    log_g: Float[Array, "B T H"] | None = None,
    *,
    segment_ids: Int[Array, "B T"] | None = None,
    deg: int = 2,
    scale: float | None = None,
    chunk_size: int | None = None,
    initial_state: RetentionState | None = None,
    return_state: bool = False,
    impl: str = "auto",
    mesh=None,
    axis: str = SEQUENCE_AXIS,
    batch_axes: tuple[str, ...] | None = None,
    debug_checks: bool = False,
):
    """`power_retention` with the sequence split over the mesh axis `axis` (see the module docstring).

    Same arguments (segment_ids and debug_checks included), shapes and result as `power_retention`.

    Args:
        q: queries [B, T, Hq, d].
        k: keys [B, T, H, d].
        v: values [B, T, H, d].
        log_g: log gates [B, T, H], <= 0, or None.
        segment_ids: int [B, T] or None.
        deg: the even degree p >= 2.
        scale: None is d^-0.5.
        chunk_size: one of CHUNK_SIZES; None: the local op's default for T / n tokens.
        initial_state: the state before token 0 (None: empty).
        return_state: also return the state after the last token.
        impl: the local op's, which runs from a state: one of STATE_IMPLS ("auto", "xla" or "pallas").
        mesh (Mesh | None): the device mesh, or None for the ambient one (`jax.set_mesh`).
        axis: the mesh axis that splits the sequence; T must be a multiple of its size.
        batch_axes: the mesh axes that split the batch (default: every other axis but "tensor"); B must be a
            multiple of their product. A "tensor" axis (not among batch_axes) splits the heads, so its size must
            divide H and Hq.
        debug_checks: as in `power_retention`.

    Returns:
        (Array | tuple[Array, RetentionState]): y [B, T, Hq, d], or the pair (y, state) with `return_state`.
    """
    check_op_args(q, k, v, log_g, segment_ids, deg, scale, chunk_size, impl, STATE_IMPLS)
    B, T, _, d = q.shape
    H = k.shape[2]
    if initial_state is not None:
        check_state(initial_state, B, H, d, deg, "initial_state")
    mesh, n, rows = resolve_sequence_mesh(mesh, axis, batch_axes, B, T)
    heads = heads_axis(mesh, axis, rows, {"q.shape[2] (query heads)": q.shape[2], "k.shape[2] (kv heads)": H})
    if debug_checks:
        run_debug_checks(q, k, v, log_g, segment_ids, initial_state, "initial_state")
    c = chunk_size or default_chunk_size(T // n)
    gated, has_init, packed = log_g is not None, initial_state is not None, segment_ids is not None
    log_g = jnp.zeros(k.shape[:3], jnp.float32) if log_g is None else log_g

    def local(q, k, v, log_g, S0_aug, *packing):  # packing: (segment ids, document starts) when packed
        segment_ids, starts = packing if packed else (None, None)
        S_loc, a_loc, r_loc = _local_state(k, v, log_g, segment_ids, deg, c)
        first = jnp.zeros((q.shape[0], 1), bool) if starts is None else starts[:, :1]  # [B, 1]: token 0 starts one
        a_before, r_before, S_in = exclusive_scan((a_loc, r_loc | first, S_loc), combine_decayed, axis, n)
        if has_init:  # the state from before the sequence, decayed over the devices before this one
            S_in = S_in + jnp.where(r_before[..., None, None], 0.0, decay_state(jnp.exp(a_before), S0_aug))
        y, state = power_retention(
            q,
            k,
            v,
            log_g if gated else None,
            segment_ids=segment_ids,
            deg=deg,
            scale=scale,
            chunk_size=chunk_size,  # None: the local op's default (the kernels' own with impl="pallas")
            initial_state=split(jnp.where(first[..., None, None], 0.0, S_in)),
            return_state=True,
            impl=impl,
        )
        if not return_state:
            return y
        last = jax.lax.axis_index(axis) == n - 1  # the last device's final state is the sequence's
        return y, jax.lax.psum(jnp.where(last, augment(state), 0.0), axis)

    seq, state_spec, tokens = P(rows, axis, heads, None), P(rows, heads, None, None), P(rows, axis)
    S0 = augment(initial_state) if has_init else jnp.zeros((B, 1, 1, 1), jnp.float32)
    S0_spec = state_spec if has_init else P(rows, None, None, None)
    out_specs = (seq, state_spec) if return_state else seq
    in_specs = (seq, seq, seq, P(rows, axis, heads), S0_spec) + ((tokens, tokens) if packed else ())
    packing = (segment_ids, document_starts(segment_ids)) if packed else ()  # starts: over the whole sequence
    run = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=not interpreted(impl))
    out = run(q, k, v, log_g, S0, *packing)
    return (out[0], split(out[1])) if return_state else out
