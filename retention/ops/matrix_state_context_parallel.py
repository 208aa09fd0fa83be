"""Context parallelism for the matrix-state ops (linear attention, GLA, the gated delta rule): the sequence split
over a mesh axis, as power retention's (`power_retention/context_parallel.py`).

Each device's tokens map the state entering them, S_in [B, H, d_k, d_v], to the state leaving them by an affine
map S_out = A(S_in) + S_loc, S_loc the state of its tokens from an empty one. Device i of n holds tokens
[i*T/n, (i+1)*T/n) and
1. runs the op on its tokens once (the public op with its part of segment_ids, return_state), which gives S_loc,
   its outputs from an empty state o_loc and, for the gated delta rule, its transition: A is
   - linear attention, GLA: a decay, exp(a) with a the sum of its log-gates [B, H] (GLA: per key channel
     [B, H, d_k]), as power retention's;
   - the gated delta rule: a matrix, S -> M S with M [B, H, d_k, d_k] the product of the tokens'
     exp(g_t) (I - beta_t k_t k_t^T), later tokens on the left. The op is linear in S, so it runs on the values
     [0 | v] from the state [I | 0] (d_k + d_v value columns): the state it returns is [M | S_loc] and its
     outputs [p | o_loc], p_i = scale M_i^T q_i with M_i the product up to token i;
   and whether it resets, r (a document start after its first token, a scalar gate at or below LOG_G_ZERO);
2. the segments (A, r, S_loc) combine as an exclusive prefix over the devices (`context_mesh.exclusive_scan`:
   1 + ceil(log2 n) rounds of one segment each per device by `ppermute`) under
   (A_l, r_l, S_l) . (A_r, r_r, S_r) = (A_r A_l, r_l or r_r, S_r if r_r else A_r(S_l) + S_r)
   (decays: `decay.combine_decayed`, as power retention; matrices: `combine_transitions`), which gives each
   device the state entering it, S_in (the initial state, if any, carried in by the devices before; a device
   whose first token starts a document starts from an empty state);
3. it finishes its outputs from S_in: o_i = o_loc_i + p_i^T S_in for its rows before its first reset, p_i =
   scale exp(F_i) q_i for the decays (F_i the sum of the log-gates from its first token to i, per channel for
   GLA), the p above for the gated delta rule. The last device's S_out is the sequence's final state.
Forward and gradients (JAX differentiates through `shard_map` and `ppermute`) equal one device's op to float32
rounding. Each round sends one segment per device: B*H*d_k*d_v*4 bytes of state plus the transition, B*H*4
(linear attention), B*H*d_k*4 (GLA) or B*H*d_k*d_k*4 (the gated delta rule) bytes, and B*H bytes of resets.
The gated delta rule's local op runs d_k + d_v value columns instead of d_v.

A "tensor" axis of size t > 1 splits the heads inside the shard_map as in power retention
(`context_mesh.heads_axis`): t must divide Hq and H. The ops' public forms are `*_context_parallel` in their
folders; the mixers (D, G, M) switch to them under a mesh whose "sequence" axis has more than one device.
"""

import jax
import jax.numpy as jnp
from einops import rearrange
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

from retention.ops.context_mesh import exclusive_scan, heads_axis, resolve_sequence_mesh, vary_like
from retention.ops.decay import combine_decayed, decay_state
from retention.ops.matrix_state import check_args, check_matrix_state, token_gates
from retention.ops.segments import document_starts

TRANSITIONS = ("decay", "matrix")


def apply_matrix(M_BHkk: Float[Array, "B H dk dk"], S_BHkv: Float[Array, "B H dk dv"]) -> Float[Array, "B H dk dv"]:
    """A transition applied to a state, per row and head.

    Args:
        M_BHkk: the transition [B, H, d_k, d_k].
        S_BHkv: the state [B, H, d_k, d_v].

    Returns:
        M S [B, H, d_k, d_v].
    """
    return jnp.einsum("bhij,bhje->bhie", M_BHkk, S_BHkv)


def combine_transitions(earlier: tuple, later: tuple) -> tuple:
    """Two consecutive segments of the gated delta rule composed, (M, r, S) each: M the transition [B, H, d_k, d_k]
    (the state entering the segment S_in leaves it as M S_in + S), r whether it resets [B, H], S its state from
    empty [B, H, d_k, d_v]: (M_r M_l, r_l or r_r, S_r if r_r else M_r S_l + S_r); a reset takes the later segment's
    M and S as they are (its M is 0 but for a NaN), so a NaN before it stays there. Identity: (I, False, 0).

    Args:
        earlier: (M, r, S) of the earlier segment.
        later: (M, r, S) of the later one.

    Returns:
        (M, r, S) of the two together.
    """
    (M_l, r_l, S_l), (M_r, r_r, S_r) = earlier, later
    resets = r_r[..., None, None]
    return jnp.where(resets, M_r, M_r @ M_l), r_l | r_r, jnp.where(resets, S_r, apply_matrix(M_r, S_l) + S_r)


def _local_pass(op, transition, q, k, v, gates, segment_ids, a, *, scale, chunk_size):
    """The op on this device's tokens from an empty state (module docstring, step 1): (o_loc [B, T, Hq, d_v], p
    [B, T, H, g, d_k] (query head h*g + j reads kv-head h), the transition A, S_loc), float32. `a`: the tokens'
    finite log-gates (`matrix_state.token_gates`), [B, T, H] or [B, T, H, d_k]."""
    B, T, Hq, d_k = q.shape
    H, d_v, f32 = k.shape[2], v.shape[-1], jnp.float32
    options = dict(segment_ids=segment_ids, scale=scale, chunk_size=chunk_size, return_state=True)
    if transition == "matrix":  # values [0 | v] from [I | 0]: the state [M | S_loc], the outputs [p | o_loc]
        v_aug = jnp.concatenate([jnp.zeros((B, T, H, d_k), f32), v.astype(f32)], axis=-1)
        eye = jnp.broadcast_to(jnp.eye(d_k, dtype=f32), (B, H, d_k, d_k))
        X0 = vary_like(jnp.concatenate([eye, jnp.zeros((B, H, d_k, d_v), f32)], axis=-1), k)
        o_aug, X = op(q, k, v_aug, *gates, initial_state=X0, **options)
        p = rearrange(o_aug[..., :d_k], "B T (H g) d -> B T H g d", H=H)
        return o_aug[..., d_k:], p, X[..., :d_k], X[..., d_k:]
    S0 = vary_like(jnp.zeros((B, H, d_k, d_v), f32), k)
    o_loc, S_loc = op(q, k, v.astype(f32), *gates, initial_state=S0, **options)
    F = jnp.cumsum(a, axis=1)  # [B, T, H] or [B, T, H, d_k]: the log-decay from the first token on, finite, <= 0
    fq = jnp.exp(F[:, :, :, None, None] if F.ndim == 3 else F[:, :, :, None, :])  # (rows after a reset: masked)
    p = rearrange(q.astype(f32) * scale, "B T (H g) d -> B T H g d", H=H) * fq
    return o_loc, p, F[:, -1], S_loc


def _apply(transition: str, A, S):
    """A applied to the state S: decay_state(exp(a), S) or M S."""
    return apply_matrix(A, S) if transition == "matrix" else decay_state(jnp.exp(A), S)


def matrix_state_context_parallel(
    op,
    check_gates,
    transition: str,
    q,
    k,
    v,
    gates: tuple,
    *,
    segment_ids=None,
    scale=None,
    chunk_size=None,
    initial_state=None,
    return_state: bool = False,
    mesh=None,
    axis: str,
    batch_axes=None,
):
    """A matrix-state op with the sequence split over the mesh axis `axis` (module docstring): the shared body of
    `linear_attention_context_parallel`, `gated_linear_attention_context_parallel` and
    `gated_delta_rule_context_parallel`.

    Args:
        op: the public single-device op, op(q, k, v, *gates, segment_ids=, scale=, chunk_size=, initial_state=,
            return_state=True) -> (o, state).
        check_gates: the op's gate checks, check_gates(k, *gates) (ValueError naming the argument).
        transition: "decay" (linear attention, GLA: the last gate is log_g [B, T, H] or [B, T, H, d_k], None for
            no decay) or "matrix" (the gated delta rule: gates (beta, log_g)).
        q: queries [B, T, Hq, d_k].
        k: keys [B, T, H, d_k].
        v: values [B, T, H, d_v].
        gates: the op's gate arrays after v, [B, T, H, ...] each (or None where the op allows it).
        segment_ids: int [B, T] or None.
        scale: None is d_k^-0.5.
        chunk_size: the local op's, one of CHUNK_SIZES; None: its default for T / n tokens.
        initial_state: S_0 [B, H, d_k, d_v] float32, or None.
        return_state: also return the state after the last token.
        mesh (Mesh | None): the device mesh, or None for the ambient one (`jax.set_mesh`).
        axis: the mesh axis that splits the sequence; T must be a multiple of its size.
        batch_axes: the mesh axes that split the batch (None: every other axis but "tensor"); B must be a multiple
            of their product. A "tensor" axis (not among them) splits the heads: its size must divide Hq and H.

    Returns:
        (Array | tuple[Array, Array]): o [B, T, Hq, d_v] in v's dtype; with `return_state` the pair (o, state),
            state [B, H, d_k, d_v] float32.
    """
    if transition not in TRANSITIONS:
        raise ValueError(f"transition must be one of {TRANSITIONS}, got {transition!r}")
    scale = check_args(q, k, v, segment_ids, scale, chunk_size)
    check_gates(k, *gates)
    B, T, Hq, d_k = q.shape
    H, d_v = k.shape[2], v.shape[-1]
    if initial_state is not None:
        check_matrix_state(initial_state, B, H, d_k, d_v, "initial_state")
    mesh, n, rows = resolve_sequence_mesh(mesh, axis, batch_axes, B, T)
    heads = heads_axis(mesh, axis, rows, {"q.shape[2] (query heads)": Hq, "k.shape[2] (kv heads)": H})
    has_init, packed = initial_state is not None, segment_ids is not None
    gates = (*gates[:-1], jnp.zeros((B, T, H), jnp.float32) if gates[-1] is None else gates[-1])  # None: no decay
    identity = (jnp.eye(d_k, dtype=jnp.float32), False, 0.0) if transition == "matrix" else None  # None: zeros
    combine = combine_transitions if transition == "matrix" else combine_decayed
    n_gates = len(gates)

    def local(q, k, v, *rest):  # rest: the gates, S0, and (segment ids, document starts) when packed
        gates, S0 = rest[:n_gates], rest[n_gates]
        segment_ids, starts = rest[n_gates + 1 :] if packed else (None, None)
        first = jnp.zeros((q.shape[0], 1), bool) if starts is None else starts[:, :1]  # [B, 1]: token 0 starts one
        tokens = token_gates(k, v, gates[-1], segment_ids, per_channel=gates[-1].ndim == 4)
        reset_counts = jnp.cumsum(tokens.reset, axis=1)  # [B, T, H]
        resets = (reset_counts[:, -1] > 0) | first  # [B, H]
        o_loc, p, A, S_loc = _local_pass(
            op, transition, q, k, v, gates, segment_ids, tokens.a, scale=scale, chunk_size=chunk_size
        )
        A_before, r_before, S_in = exclusive_scan((A, resets, S_loc), combine, axis, n, identity)
        if has_init:  # the state from before the sequence, carried over the devices before this one
            S_in = S_in + jnp.where(r_before[..., None, None], 0.0, _apply(transition, A_before, S0))
        S_in = jnp.where(first[..., None, None], 0.0, S_in)
        read = jnp.einsum("bthgd,bhde->bthge", p, S_in)
        fresh = (reset_counts == 0)[..., None, None]  # rows before this device's first reset read S_in
        o = o_loc + rearrange(jnp.where(fresh, read, 0.0), "B T H g e -> B T (H g) e")
        if not return_state:
            return o.astype(v.dtype)
        S_out = jnp.where(resets[..., None, None], S_loc, _apply(transition, A, S_in) + S_loc)
        last = jax.lax.axis_index(axis) == n - 1  # the last device's final state is the sequence's
        return o.astype(v.dtype), jax.lax.psum(jnp.where(last, S_out, 0.0), axis)

    seq, state_spec, tokens = P(rows, axis, heads, None), P(rows, heads, None, None), P(rows, axis)
    gates_spec = tuple(P(rows, axis, heads, *(None,) * (g.ndim - 3)) for g in gates)
    S0 = initial_state if has_init else jnp.zeros((B, 1, 1, 1), jnp.float32)
    S0_spec = state_spec if has_init else P(rows, None, None, None)
    in_specs = (seq, seq, seq, *gates_spec, S0_spec) + ((tokens, tokens) if packed else ())
    out_specs = (seq, state_spec) if return_state else seq
    packing = (segment_ids, document_starts(segment_ids)) if packed else ()  # starts: over the whole sequence
    run = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    return run(q, k, v, *gates, S0, *packing)
