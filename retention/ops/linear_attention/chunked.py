"""Chunked linear attention with a scalar decay per token and head, in plain JAX.

S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t. Per chunk of c tokens (F, R from
`matrix_state.chunk_gates`; the masks of `retention/ops/decay.py`, at degree 1):
- inside it, o_i += sum_{j <= i, same document} (q_i . k_j) exp(F_i - F_j) v_j;
- across chunks, o_i += exp(F_i) q_i^T S for the rows before the chunk's first reset, and
  S <- exp(F_end) S + sum_{j in the last document} exp(F_end - F_j) k_j v_j^T (S dropped when the chunk resets;
  NaN when its last document is poisoned).
Every exponent is <= 0. The intra-chunk part runs batched over all chunks ([B, N, H, g, c, c] scores: linear in T);
the state runs as a rematerialised `lax.scan` over chunks (the backward keeps one [B, H, d_k, d_v] state per chunk).
"""

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from retention.ops.decay import causal_decay, decay_state, gate_factors
from retention.ops.matrix_state import chunked_inputs, poison_state, scan_state


def linear_attention_chunked(
    q: Float[Array, "B T Hq dk"],
    k: Float[Array, "B T H dk"],
    v: Float[Array, "B T H dv"],
    log_g: Float[Array, "B T H"] | None,
    initial_state: Float[Array, "B H dk dv"] | None,
    *,
    segment_ids: Int[Array, "B T"] | None,
    scale: float,
    chunk_size: int,
) -> tuple[Float[Array, "B T Hq dv"], Float[Array, "B H dk dv"]]:
    """(o in v's dtype, the final state float32) over T tokens from `initial_state` (None: zeros), in chunks of
    `chunk_size`, float32 throughout. Inputs are assumed validated (see `linear_attention`)."""
    _, gates, q_c, k_c, v_c, S0 = chunked_inputs(q, k, v, log_g, segment_ids, initial_state, scale=scale, c=chunk_size)

    scores = jnp.einsum("bnhgid,bnhjd->bnhgij", q_c, k_c) * causal_decay(gates.F, gates.R)[:, :, :, None]
    intra = jnp.einsum("bnhgij,bnhje->bnhgie", scores, v_c)

    fq, fk, decay = gate_factors(gates.F, gates.R, 1)

    def body(S, xs):
        q_BHgcd, k_BHcd, v_BHce, decay_BH, poisoned_BH = xs
        read = jnp.einsum("bhgcd,bhde->bhgce", q_BHgcd, S)
        S = decay_state(decay_BH, S) + jnp.einsum("bhcd,bhce->bhde", k_BHcd, v_BHce)
        return poison_state(S, poisoned_BH), read

    xs = (q_c * fq[:, :, :, None, :, None], k_c * fk[..., None], v_c, decay, gates.poisoned[..., -1])
    return scan_state(body, S0, xs, intra, gates, q.shape[1], v.dtype)
