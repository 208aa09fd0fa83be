"""Chunked gated linear attention (GLA: a decay per key channel) in plain JAX, with secondary chunking in log space.

S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t. Per chunk of c tokens, F [c, d_k] the cumulative
log-gates per channel and R the reset counts (`matrix_state.chunk_gates`):
- across chunks: o_i += (q_i * exp(F_i))^T S for the rows before the chunk's first reset;
  S <- diag(exp(F_end)) S + sum_{j in the last document} (k_j * exp(F_end - F_j)) v_j^T;
- inside it, A_ij = sum_m q_im k_jm exp(F_im - F_jm) for j <= i in one document, o_i += sum_j A_ij v_j. The
  chunk is cut into sub-chunks of s tokens. For j in an earlier sub-chunk J than i's, I, the factor splits at
  I's first token r: (q_i * exp(F_i - F_r)) . (k_j * exp(F_r - F_j)), two matmul operands whose exponents are
  both <= 0; inside a sub-chunk the s x s x d_k exponents exp(F_i - F_j) are formed directly (masked to j <= i).
No exponent is ever positive, so strong decays stay finite. The intra-chunk part runs over groups of chunks (about
16 MB of temporaries each, rematerialised); the state as a rematerialised `lax.scan` over chunks.
"""

import jax
import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float, Int

from retention.ops.decay import decay_state, masked_exp
from retention.ops.matrix_state import chunk_major, chunked_inputs, poison_state, scan_state

SUB_CHUNK = 16
INTRA_GROUP_BYTES = 1 << 24


def intra_chunk(
    q_BHgcd: Float[Array, "B H g c dk"],
    k_BHcd: Float[Array, "B H c dk"],
    v_BHce: Float[Array, "B H c dv"],
    F_BHcd: Float[Array, "B H c dk"],
    R_BHc: Int[Array, "B H c"],
    s: int,
) -> Float[Array, "B H g c dv"]:
    """sum_j A_ij v_j inside one chunk (module docstring), with sub-chunks of s tokens (s divides c)."""
    c = q_BHgcd.shape[-2]
    n = c // s
    q_s = rearrange(q_BHgcd, "b h g (n s) d -> b h g n s d", s=s)
    k_s = rearrange(k_BHcd, "b h (n s) d -> b h n s d", s=s)
    F_s = rearrange(F_BHcd, "b h (n s) d -> b h n s d", s=s)
    ref = F_s[:, :, :, :1]  # each sub-chunk's first token: [b, h, n, 1, d]
    q_ref = q_s * jnp.exp(F_s - ref)[:, :, None]  # F_i <= F_r within a sub-chunk
    earlier = jnp.tril(jnp.ones((n, n), bool), -1)  # J < I
    k_ref = k_s[:, :, None] * masked_exp(ref[:, :, :, None] - F_s[:, :, None], earlier[:, :, None, None])
    A_off = jnp.einsum("bhgIid,bhIJjd->bhgIiJj", q_ref, k_ref)  # [b, h, g, I, i, J, j]
    causal = jnp.tril(jnp.ones((s, s), bool))
    E = masked_exp(F_s[:, :, :, :, None] - F_s[:, :, :, None, :], causal[:, :, None])  # [b, h, n, i, j, d]
    A_diag = jnp.einsum("bhgnid,bhnjd,bhnijd->bhgnij", q_s, k_s, E)
    diagonal = jnp.eye(n, dtype=bool)[:, None, :, None]
    A = jnp.where(diagonal, A_diag[:, :, :, :, :, None, :], A_off).reshape(A_off.shape[:3] + (c, c))
    visible = jnp.tril(jnp.ones((c, c), bool)) & (R_BHc[:, :, :, None] == R_BHc[:, :, None, :])
    return jnp.einsum("bhgij,bhje->bhgie", jnp.where(visible[:, :, None], A, 0.0), v_BHce)


def _intra_chunks(q_NBHgcd, k_NBHcd, v_NBHce, F_NBHcd, R_NBHc, s):
    """`intra_chunk` for all N chunks, in rematerialised groups of about INTRA_GROUP_BYTES of temporaries."""
    _, B, H, g, c, d = q_NBHgcd.shape
    per_chunk = 4 * B * H * (g * c * c + c * s * d + c * (c // s) * d)
    one = jax.checkpoint(lambda xs: intra_chunk(*xs, s))
    xs = (q_NBHgcd, k_NBHcd, v_NBHce, F_NBHcd, R_NBHc)
    return jax.lax.map(one, xs, batch_size=max(1, INTRA_GROUP_BYTES // per_chunk))


def state_factors(
    F: Float[Array, "B N H c dk"], R: Int[Array, "B N H c"]
) -> tuple[Float[Array, "B N H c dk"], Float[Array, "B N H c dk"], Float[Array, "B N H dk"]]:
    """The cross-chunk factors of the module docstring (the reset contract of `decay.py`, per key channel).

    Args:
        F: the cumulative log-gates of each chunk.
        R: the reset counts.

    Returns:
        (the queries' factors on the carried state, exp(F) where R == 0; the keys' factors into the state carried
            out, exp(F_end - F) where R == R_end; each chunk's decay of the carried state, exp(F_end) where
            R_end == 0), 0 elsewhere.
    """
    R = R[..., None]
    F_end, R_end = F[..., -1:, :], R[..., -1:, :]
    return masked_exp(F, R == 0), masked_exp(F_end - F, R == R_end), masked_exp(F_end, R_end == 0)[..., 0, :]


def gated_linear_attention_chunked(
    q: Float[Array, "B T Hq dk"],
    k: Float[Array, "B T H dk"],
    v: Float[Array, "B T H dv"],
    log_g: Float[Array, "B T H dk"],
    initial_state: Float[Array, "B H dk dv"] | None,
    *,
    segment_ids: Int[Array, "B T"] | None,
    scale: float,
    chunk_size: int,
) -> tuple[Float[Array, "B T Hq dv"], Float[Array, "B H dk dv"]]:
    """(o in v's dtype, the final state float32) over T tokens from `initial_state` (None: zeros), in chunks of
    `chunk_size` (a multiple of SUB_CHUNK, or at most SUB_CHUNK), float32 throughout. Inputs are assumed
    validated (see `gated_linear_attention`)."""
    _, gates, q_c, k_c, v_c, S0 = chunked_inputs(
        q, k, v, log_g, segment_ids, initial_state, scale=scale, c=chunk_size, per_channel=True
    )  # F [..., dk]
    intra = _intra_chunks(*map(chunk_major, (q_c, k_c, v_c, gates.F, gates.R)), min(SUB_CHUNK, chunk_size))

    fq, fk, decay = state_factors(gates.F, gates.R)

    def body(S, xs):
        q_BHgcd, k_BHcd, v_BHce, decay_BHd, poisoned_BH = xs
        read = jnp.einsum("bhgcd,bhde->bhgce", q_BHgcd, S)
        S = decay_state(decay_BHd, S) + jnp.einsum("bhcd,bhce->bhde", k_BHcd, v_BHce)
        return poison_state(S, poisoned_BH), read

    xs = (q_c * fq[:, :, :, None], k_c * fk, v_c, decay, gates.poisoned[..., -1])
    return scan_state(body, S0, xs, chunk_major(intra), gates, q.shape[1], v.dtype)
