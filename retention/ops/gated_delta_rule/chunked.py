"""The chunked gated delta rule (Gated DeltaNet) in plain JAX, by the WY/UT representation.

S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = scale S_t^T q_t. Equivalently
S_t = exp(g_t) S_{t-1} + k_t u_t^T with u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t). Inside a chunk of c tokens
from the state S (F the cumulative log-gates, R the reset counts: `matrix_state.chunk_gates`; D_ij =
exp(F_i - F_j) for j <= i in one document, `decay.causal_decay`):
    (I + L) U~ = diag(beta) V - diag(beta exp(F)) K S,   L_ij = beta_i (k_i . k_j) D_ij for j < i,
a unit lower-triangular system, solved once per chunk for both right-hand sides: U = (I + L)^-1 diag(beta) V and
W = (I + L)^-1 diag(beta exp(F)) K, so that U~ = U - W S. Then
    o = exp(F) Q S + (Q K^T * D) U~,    S' = exp(F_end) S + (K * exp(F_end - F))^T U~,
with the masks of `decay.gate_factors` at degree 1 (rows after the chunk's first reset do
not read S; keys of earlier documents do not enter S'). Every exponent is <= 0. U, W, Q K^T * D and their
S-free products run batched over all chunks (linear in T); the scan over chunks carries S only through W S, and
is rematerialised (the backward keeps one [B, H, d_k, d_v] state per chunk). The terms in S are masked with
`where`, so a NaN state never reaches another document's rows. The recurrence is stable for beta ||k||^2 <= 2
(the Gated DeltaNet mixer L2-normalises k).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from retention.ops.decay import causal_decay, decay_state, gate_factors, masked_exp
from retention.ops.matrix_state import ChunkGates, TokenGates, chunked_inputs, poison_state, scan_state, to_chunks


class DeltaChunks(NamedTuple):
    """The S-free operands of every chunk (module docstring): q~ = scale q exp(F) (0 after the chunk's first reset),
    A = Q K^T * D, W and U, the keys decayed to the chunk's end (0 outside its last document), the chunk's decay of S
    and whether S's terms enter S' (the chunk's last document started before it), float32."""

    q: Float[Array, "B N H g c dk"]
    A: Float[Array, "B N H g c c"]
    W: Float[Array, "B N H c dk"]
    U: Float[Array, "B N H c dv"]
    k_out: Float[Array, "B N H c dk"]
    decay: Float[Array, "B N H"]
    continues: Bool[Array, "B N H"]


def xla_operands(
    q_c: Float[Array, "B N H g c dk"],
    k_c: Float[Array, "B N H c dk"],
    v_c: Float[Array, "B N H c dv"],
    beta_c: Float[Array, "B N H c"],
    F: Float[Array, "B N H c"],
    R: Int[Array, "B N H c"],
) -> tuple[Float[Array, "B N H g c c"], Float[Array, "B N H c dk"], Float[Array, "B N H c dv"]]:
    """The chunks' A = Q K^T * D, W and U (module docstring) in XLA: one triangular solve per chunk, batched.

    Args:
        q_c: the scaled queries per chunk.
        k_c: the keys.
        v_c: the values.
        beta_c: the write strengths.
        F: the cumulative log-gates.
        R: the reset counts.

    Returns:
        (A, W, U), float32.
    """
    c, d_v, beta_c = k_c.shape[-2], v_c.shape[-1], beta_c[..., None]
    D = causal_decay(F, R)  # [B, N, H, c, c]
    strictly_lower = jnp.tril(jnp.ones((c, c), bool), -1)
    L = jnp.where(strictly_lower, beta_c * jnp.einsum("bnhid,bnhjd->bnhij", k_c, k_c) * D, 0.0)
    rhs = jnp.concatenate([beta_c * v_c, beta_c * masked_exp(F, R == 0)[..., None] * k_c], axis=-1)
    solved = jax.lax.linalg.triangular_solve(L, rhs, left_side=True, lower=True, unit_diagonal=True)
    return jnp.einsum("bnhgid,bnhjd->bnhgij", q_c, k_c) * D[:, :, :, None], solved[..., d_v:], solved[..., :d_v]


def delta_chunks(
    q, k, v, beta, log_g, initial_state, *, segment_ids, scale: float, chunk_size: int, operands=xla_operands
) -> tuple[TokenGates, ChunkGates, DeltaChunks, Float[Array, "B H dk dv"]]:
    """The chunked paths' (XLA and Pallas) common start.

    Args:
        q: queries [B, T, Hq, d_k].
        k: keys [B, T, H, d_k].
        v: values [B, T, H, d_v].
        beta: write strengths [B, T, H].
        log_g: log decays [B, T, H] or None.
        initial_state: S_0 [B, H, d_k, d_v] float32, or None (zeros).
        segment_ids: int [B, T] or None.
        scale: multiplies q.
        chunk_size: tokens per chunk.
        operands: (q_c, k_c, v_c, beta_c, F, R) -> (A, W, U) per chunk (`xla_operands`, or the kernels').

    Returns:
        (the token gates, the chunk gates, the chunks' operands, S0).
    """
    c = chunk_size
    tokens, gates, q_c, k_c, v_c, S0 = chunked_inputs(
        q, k, v, log_g, segment_ids, initial_state, scale=scale, c=c, beta=beta
    )
    fq, fk, decay = gate_factors(gates.F, gates.R, 1)
    A, W, U = operands(q_c, k_c, v_c, to_chunks(tokens.beta, c), gates.F, gates.R)
    k_out = k_c * fk[..., None]  # keys of the chunk's last document, decayed to its end
    continues = gates.R[..., -1] == 0  # the chunk's last document started before it: S's terms enter S'
    chunks = DeltaChunks(q_c * fq[:, :, :, None, :, None], A, W, U, k_out, decay, continues)
    return tokens, gates, chunks, S0


def gated_delta_rule_chunked(
    q: Float[Array, "B T Hq dk"],
    k: Float[Array, "B T H dk"],
    v: Float[Array, "B T H dv"],
    beta: Float[Array, "B T H"],
    log_g: Float[Array, "B T H"] | None,
    initial_state: Float[Array, "B H dk dv"] | None,
    *,
    segment_ids: Int[Array, "B T"] | None,
    scale: float,
    chunk_size: int,
) -> tuple[Float[Array, "B T Hq dv"], Float[Array, "B H dk dv"]]:
    """(o in v's dtype, the final state float32) over T tokens from `initial_state` (None: zeros), in chunks of
    `chunk_size`, float32 throughout. Inputs are assumed validated (see `gated_delta_rule`)."""
    _, gates, x, S0 = delta_chunks(
        q, k, v, beta, log_g, initial_state, segment_ids=segment_ids, scale=scale, chunk_size=chunk_size
    )
    AU = jnp.einsum("bnhgij,bnhje->bnhgie", x.A, x.U)
    KU = jnp.einsum("bnhcd,bnhce->bnhde", x.k_out, x.U)

    def body(S, xs):
        q_BHgcd, A_BHgcc, W_BHcd, k_BHcd, KU_BHde, decay_BH, continues_BH, poisoned_BH = xs
        WS = jnp.einsum("bhcd,bhde->bhce", W_BHcd, S)
        read = jnp.einsum("bhgcd,bhde->bhgce", q_BHgcd, S) - jnp.einsum("bhgij,bhje->bhgie", A_BHgcc, WS)
        carried = jnp.where(continues_BH[..., None, None], jnp.einsum("bhcd,bhce->bhde", k_BHcd, WS), 0.0)
        S = decay_state(decay_BH, S) + KU_BHde - carried
        return poison_state(S, poisoned_BH), read

    xs = (x.q, x.A, x.W, x.k_out, KU, x.decay, x.continues, gates.poisoned[..., -1])
    return scan_state(body, S0, xs, AU, gates, q.shape[1], v.dtype)
