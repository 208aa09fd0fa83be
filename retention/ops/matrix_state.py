"""What the matrix-state ops share (linear attention, gated linear attention, the gated delta rule): their state
S [B, H, d_k, d_v] (float32), their public front (argument checks, chunk size, dispatch to the chunked path: `full_op`,
`step_op`), the per-token resets and log-gates, and the chunking's start and end (`chunked_inputs`, `scan_state`).

Per token t and kv-head (the resets the chunk masks of `decay.py` read; power retention's `power_retention/gates.py`
keeps the same):
- reset_t (the state carried into t is cleared): t > 0 and segment_ids[b, t] != segment_ids[b, t-1], or (scalar
  gates) log_g_t <= LOG_G_ZERO (-inf, or a gate that is exactly 0 in float32);
- a_t, the finite log-gate: 0 at a reset, else log_g_t (per-channel gates below LOG_G_ZERO count as LOG_G_ZERO,
  whose exp is 0 in float32), 0 where log_g_t is positive or NaN;
- bad_t: log_g_t is positive or NaN (in any channel), or k_t or v_t has a non-finite entry, or beta_t is not in
  [0, 1]. Those tokens' k, v and beta become zeros, so every product of the chunked forms stays finite, and the
  NaN is put back by a mask: in that token's row and in every later row of its document. A bad k or v leaves the
  token's gate in a, so the other documents' arithmetic is exactly that of clean inputs.
Per chunk of c tokens (T padded to N*c with a = 0, zero keys and values, no reset): F the inclusive cumulative sum
of a (finite, non-increasing, so every exp(F_i - F_j), j <= i, is <= 1), R the number of resets up to each
token, and `poisoned`, true from a bad token to the end of its document inside the chunk.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from einops import rearrange
from jaxtyping import Array, Bool, Float, Int

from retention.ops.chunking import default_chunk_size
from retention.ops.decay import LOG_G_ZERO, decay_state, masked_exp
from retention.ops.kernel_mesh import BATCH, HEADS, run_sharded, shard_plan
from retention.ops.segments import document_starts
from retention.ops.validation import FLOAT_DTYPES, check_chunk_size, check_qkv, check_scale, check_segment_ids
from retention.validation import check_int, concrete

SUB_CHUNK = 16  # the decode step's chunk is the step itself, rounded up to a multiple of this past it


def init_matrix_state(batch: int, heads: int, d_k: int, d_v: int) -> Float[Array, "B H dk dv"]:
    """An empty state of the matrix-state ops (linear attention, GLA, the gated delta rule).

    Args:
        batch: rows B.
        heads: kv-heads H.
        d_k: the key dim.
        d_v: the value dim.

    Returns:
        Zeros [batch, heads, d_k, d_v], float32.
    """
    for name, value in (("batch", batch), ("heads", heads), ("d_k", d_k), ("d_v", d_v)):
        check_int(name, value)
    return jnp.zeros((batch, heads, d_k, d_v), jnp.float32)


def check_matrix_state(state, B: int, H: int, d_k: int, d_v: int, name: str) -> None:
    """`state` (the argument `name`) is a float32 array [B, H, d_k, d_v]."""
    if not hasattr(state, "shape") or not hasattr(state, "dtype"):
        raise TypeError(f"{name} must be a float32 array [B, H, d_k, d_v] (see init_matrix_state), got {type(state)}")
    if state.dtype != jnp.float32:
        raise TypeError(f"{name} must be float32 [B, H, d_k, d_v] (see init_matrix_state), got {state.dtype}")
    if tuple(state.shape) != (B, H, d_k, d_v):
        raise ValueError(f"{name} must have shape [B, H, d_k, d_v] = {(B, H, d_k, d_v)}, got {tuple(state.shape)}")


def check_args(q, k, v, segment_ids, scale, chunk_size) -> float:
    """The checks every matrix-state op makes: q [B, T, Hq, d_k], k [B, T, H, d_k], v [B, T, H, d_v] (Hq a
    multiple of H), segment_ids, scale, chunk_size (one of CHUNK_SIZES or None). Returns the scale (None:
    d_k^-0.5)."""
    check_qkv(q, k, v, any_value_dim=True)
    check_segment_ids(segment_ids, *q.shape[:2])
    check_scale(scale)
    check_chunk_size(chunk_size)
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def full_op(
    chunked,
    preferred: int,
    check_gates,
    q,
    k,
    v,
    gates: tuple,
    *,
    segment_ids,
    scale,
    chunk_size,
    initial_state,
    return_state: bool,
):
    """A matrix-state op's full forward: the checks (`check_args`, `check_gates(k, *gates)`, initial_state), the
    chunk (chunk_size, or the smallest of CHUNK_SIZES up to `preferred` that holds T), then
    `chunked(q, k, v, *gates, initial_state, segment_ids=, scale=, chunk_size=)`. Returns o, or (o, the final
    state) with return_state."""
    scale = check_args(q, k, v, segment_ids, scale, chunk_size)
    check_gates(k, *gates)
    B, T, _, d_k = q.shape
    if initial_state is not None:
        check_matrix_state(initial_state, B, k.shape[2], d_k, v.shape[-1], "initial_state")
    c = chunk_size or default_chunk_size(T, preferred)
    o, state = chunked(q, k, v, *gates, initial_state, segment_ids=segment_ids, scale=scale, chunk_size=c)
    return (o, state) if return_state else o


def step_op(chunked, preferred: int, check_gates, state, q, k, v, gates: tuple, *, segment_ids, scale, chunk_size):
    """A matrix-state op's decode step from `state`: the checks of `full_op` and the state's, the step's chunk
    (`step_chunk`), then the chunked path from the state. Returns (o, the new state)."""
    scale = check_args(q, k, v, segment_ids, scale, chunk_size)
    check_gates(k, *gates)
    check_matrix_state(state, q.shape[0], k.shape[2], q.shape[-1], v.shape[-1], "state")
    c = step_chunk(q.shape[1], chunk_size, preferred)
    return chunked(q, k, v, *gates, state, segment_ids=segment_ids, scale=scale, chunk_size=c)


def check_beta(beta, k) -> None:
    """beta is [B, T, H] like k's first three axes, floating, and (when its values are known) in [0, 1] or NaN (a
    NaN gives NaN rows, as outside [0, 1] does where the values are traced)."""
    if getattr(beta, "shape", None) != tuple(k.shape[:3]):
        raise ValueError(f"beta must have shape [B, T, H] = {tuple(k.shape[:3])}, got {getattr(beta, 'shape', None)}")
    if beta.dtype not in FLOAT_DTYPES:
        raise TypeError(f"beta must be a floating dtype (float32 preferred), got {beta.dtype}")
    values = concrete(beta)
    if values is not None and ((values < 0) | (values > 1)).any():
        where = tuple(int(i) for i in np.argwhere((values < 0) | (values > 1))[0])
        raise ValueError(f"beta must be in [0, 1] (a write strength), got {float(values[where])} at {where}")


class TokenGates(NamedTuple):
    """k, v (and beta) with bad tokens zeroed; a [B, T, H] or [B, T, H, d_k]; reset and bad [B, T, H]."""

    k: Float[Array, "B T H dk"]
    v: Float[Array, "B T H dv"]
    beta: Float[Array, "B T H"] | None
    a: Float[Array, "B T H *dk"]
    reset: Bool[Array, "B T H"]
    bad: Bool[Array, "B T H"]

    def decay(self) -> Float[Array, "B T H *dk"]:
        """exp(a_t) per token (per channel), 0 at a reset, NaN at a bad token: the recurrences' factor on S."""
        extra = (Ellipsis, None) if self.a.ndim == 4 else (Ellipsis,)
        return jnp.where(self.bad[extra], jnp.nan, masked_exp(self.a, ~self.reset[extra]))


def token_gates(
    k: Float[Array, "B T H dk"],
    v: Float[Array, "B T H dv"],
    log_g: Float[Array, "B T H *dk"] | None,
    segment_ids: Int[Array, "B T"] | None,
    *,
    beta: Float[Array, "B T H"] | None = None,
    per_channel: bool = False,
    dtype=jnp.float32,
) -> TokenGates:
    """The per-token finite log-gates a, resets and bad tokens of the module docstring (log_g None: a = 0;
    per_channel: log_g is [B, T, H, d_k]), with k, v and beta zeroed at the bad tokens."""
    B, T, H = k.shape[:3]
    bad = ~(jnp.isfinite(k).all(-1) & jnp.isfinite(v).all(-1))
    if beta is not None:
        beta = beta.astype(dtype)
        bad = bad | ~((beta >= 0) & (beta <= 1))
        beta = jnp.where(bad, 0.0, beta)
    k, v = (jnp.where(bad[..., None], jnp.zeros((), x.dtype), x) for x in (k, v))
    reset = (
        jnp.zeros((B, T, H), bool)
        if segment_ids is None
        else jnp.broadcast_to(document_starts(segment_ids)[..., None], (B, T, H))
    )
    if log_g is None:
        a = jnp.zeros((B, T, H), dtype)
    else:
        log_g = log_g.astype(dtype)
        allowed = log_g <= 0  # positive or NaN gates: bad tokens
        bad = bad | ~(allowed.all(-1) if per_channel else allowed)
        if per_channel:
            log_g = jnp.maximum(log_g, LOG_G_ZERO)
        else:
            reset = reset | (log_g <= LOG_G_ZERO)
        a = jnp.where(allowed, log_g, 0.0)
    a = jnp.where(reset[(Ellipsis, None) if a.ndim == 4 else Ellipsis], 0.0, a)
    return TokenGates(k=k, v=v, beta=beta, a=a, reset=reset, bad=bad)


def to_chunks(x: Float[Array, "B T H ..."], c: int) -> Float[Array, "B N H c ..."]:
    """x zero-padded to N*c tokens, N = ceil(T / c), as chunks: [B, N, H, c, ...]."""
    N = -(-x.shape[1] // c)
    x = jnp.pad(x, [(0, 0), (0, N * c - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
    return rearrange(x, "B (N c) H ... -> B N H c ...", c=c)


def from_chunks(y: Float[Array, "B N H g c e"], T: int) -> Float[Array, "B T Hg e"]:
    """The rows of [B, N, H, g, c, e] (query head h*g + i reads kv-head h) back to [B, T, H*g, e], cropped to T."""
    return rearrange(y, "B N H g c e -> B (N c) (H g) e")[:, :T]


def query_chunks(q: Float[Array, "B T Hq dk"], H: int, c: int) -> Float[Array, "B N H g c dk"]:
    """q as chunks with its query heads grouped by their kv-head: [B, N, H, g, c, d_k]."""
    return rearrange(to_chunks(q, c), "B N (H g) c d -> B N H g c d", H=H)


class ChunkGates(NamedTuple):
    """F [B, N, H, c] or [B, N, H, c, d_k] (finite), R [B, N, H, c] int32, poisoned [B, N, H, c]."""

    F: Float[Array, "B N H c *dk"]
    R: Int[Array, "B N H c"]
    poisoned: Bool[Array, "B N H c"]


def chunk_gates(tokens: TokenGates, c: int) -> ChunkGates:
    """F, R and poisoned of the module docstring, per chunk of c tokens."""
    R = jnp.cumsum(to_chunks(tokens.reset, c).astype(jnp.int32), axis=3)
    last_bad_document = jax.lax.cummax(jnp.where(to_chunks(tokens.bad, c), R, -1), axis=3)
    return ChunkGates(F=jnp.cumsum(to_chunks(tokens.a, c), axis=3), R=R, poisoned=last_bad_document == R)


def poisoned_tokens(tokens: TokenGates) -> Bool[Array, "B T H"]:
    """Whether a bad token comes at or before each token in its document (across chunks): the rows the chunked
    paths make NaN, for a path that runs on the cleaned inputs and puts the NaN back afterwards (the kernels).

    Args:
        tokens: the token gates (`token_gates`).

    Returns:
        bool [B, T, H].
    """
    document = jnp.cumsum(tokens.reset.astype(jnp.int32), axis=1)
    return jax.lax.cummax(jnp.where(tokens.bad, document, -1), axis=1) == document


def kernel_chunk(chunk_size: int) -> int:
    """The Pallas kernels' chunk for an op's: the smallest power of two >= max(chunk_size, SUB_CHUNK) (the ops'
    chunk sizes are powers of two; a decode step's may be any length).

    Args:
        chunk_size: the op's chunk.

    Returns:
        The kernels' chunk.
    """
    return max(SUB_CHUNK, 1 << (chunk_size - 1).bit_length())


TOKEN_ROLES = (BATCH, None, HEADS, None)  # q, k, v, per-channel gates [B, T, H, d]: `kernel_mesh` roles
SCALAR_ROLES = (BATCH, None, HEADS)  # per-token scalars (beta, scalar gates) [B, T, H]
STATE_ROLES = (BATCH, HEADS, None, None)  # a state [B, H, d_k, d_v]
SEGMENT_ROLES = (BATCH, None)  # segment_ids [B, T]


def kernels_on_mesh(run, q, k, args: tuple, roles: tuple, *, interpret: bool):
    """`run(*args) -> (o, state)`, a kernel path, inside a shard_map over the ambient mesh's batch and head axes
    (`kernel_mesh`: Pallas calls cannot be partitioned by XLA), or as it is without a mesh.

    Args:
        run: the path on one device's rows and kv-heads.
        q: the queries [B, T, Hq, d_k] (the plan reads B and the mesh from them).
        k: the keys [B, T, H, d_k] (H).
        args: run's arguments (None entries pass through).
        roles: each argument's dim roles (TOKEN_ROLES, SCALAR_ROLES, STATE_ROLES, SEGMENT_ROLES).
        interpret: whether the kernels run interpreted (the shard_map then skips its varying-axes check).

    Returns:
        run's (o [B, T, Hq, d_v], state [B, H, d_k, d_v]).
    """
    plan = shard_plan(q, k.shape[2])
    if plan is None:
        return run(*args)
    return run_sharded(run, plan, args, roles, (TOKEN_ROLES, STATE_ROLES), check_vma=not interpret)


def poison_rows(y: Float[Array, "B N H g c e"], poisoned: Bool[Array, "B N H c"]) -> Float[Array, "B N H g c e"]:
    """y with NaN in the poisoned rows."""
    return jnp.where(poisoned[:, :, :, None, :, None], jnp.nan, y)


def poison_state(S: Float[Array, "B H dk dv"], poisoned_BH: Bool[Array, "B H"]) -> Float[Array, "B H dk dv"]:
    """S with NaN where its chunk ended in a poisoned document."""
    return jnp.where(poisoned_BH[..., None, None], jnp.nan, S)


class ChunkedInputs(NamedTuple):
    """What every chunked path starts from: the token and chunk gates, q * scale as query chunks [B, N, H, g, c,
    d_k], k and v (bad tokens zeroed) as chunks [B, N, H, c, d], all float32, and the initial state S0."""

    tokens: TokenGates
    gates: ChunkGates
    q: Float[Array, "B N H g c dk"]
    k: Float[Array, "B N H c dk"]
    v: Float[Array, "B N H c dv"]
    S0: Float[Array, "B H dk dv"]


def chunked_inputs(
    q, k, v, log_g, segment_ids, initial_state, *, scale: float, c: int, beta=None, per_channel: bool = False
):
    """The chunked paths' common start (`token_gates` with beta and per_channel), S0 zeros when initial_state is
    None."""
    B, _, _, d_k = q.shape
    H, d_v, f32 = k.shape[2], v.shape[-1], jnp.float32
    tokens = token_gates(k, v, log_g, segment_ids, beta=beta, per_channel=per_channel)
    k_c, v_c = to_chunks(tokens.k.astype(f32), c), to_chunks(tokens.v.astype(f32), c)
    S0 = jnp.zeros((B, H, d_k, d_v), f32) if initial_state is None else initial_state
    return ChunkedInputs(tokens, chunk_gates(tokens, c), query_chunks(q.astype(f32) * scale, H, c), k_c, v_c, S0)


def scan_state(body, S0, xs: tuple, intra: Float[Array, "B N H g c dv"], gates: ChunkGates, T: int, dtype):
    """The chunked paths' common end: `body(S, x) -> (S, read)` scanned over the chunks of xs ([B, N, ...] each),
    each chunk's reads added to `intra` in its rows before the chunk's first reset, the poisoned rows NaN; returns
    (o [B, T, Hq, d_v] in `dtype`, the final state)."""
    S, reads = scan_chunks(body, S0, tuple(map(chunk_major, xs)))
    fresh = (gates.R == 0)[:, :, :, None, :, None]  # rows before the chunk's first reset read the state
    y = poison_rows(intra + jnp.where(fresh, chunk_major(reads), 0.0), gates.poisoned)
    return from_chunks(y, T).astype(dtype), S


def step_chunk(n: int, chunk_size: int | None, preferred: int) -> int:
    """The decode step's chunk: n itself up to SUB_CHUNK tokens, then n rounded up to a multiple of SUB_CHUNK, up
    to the full op's chunk (a longer step runs in chunks of that)."""
    full = chunk_size or preferred
    return n if n <= SUB_CHUNK else min(full, -(-n // SUB_CHUNK) * SUB_CHUNK)


def scan_chunks(body, S0: Float[Array, "B H dk dv"], xs):
    """lax.scan of a rematerialised `body(S, x) -> (S, out)` over chunk-major xs (N first): the backward keeps one
    state per chunk boundary and recomputes the rest."""
    return jax.lax.scan(jax.checkpoint(body), S0, xs)


def chunk_major(x):
    """[B, N, ...] -> [N, B, ...] (None stays None)."""
    return None if x is None else jnp.moveaxis(x, 1, 0)


def compute_dtype(x) -> jnp.dtype:
    """float64 for float64 inputs (the oracles), else float32."""
    return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


def decayed_write(
    S: Float[Array, "B H dk dv"], k_t: Float[Array, "B H dk"], v_t: Float[Array, "B H dv"], decay_t
) -> Float[Array, "B H dk dv"]:
    """One token of the decayed recurrences (linear attention, GLA), an `update` for `recurrence`.

    Args:
        S: the state before the token.
        k_t: the token's key.
        v_t: the token's value.
        decay_t (Array): the decay [B, H], or per key row [B, H, d_k]; 0 drops S, NaN included.

    Returns:
        decay_t S + k_t v_t^T.
    """
    return decay_state(decay_t, S) + jnp.einsum("bhd,bhe->bhde", k_t, v_t)


def recurrence(update, q: Float[Array, "B T Hq dk"], xs: tuple, S0, *, H: int, d_v: int, scale: float, dtype):
    """The token-by-token form: S_t = update(S_{t-1}, *x_t) for the per-token arrays xs ([B, T, H, ...] each),
    o_t = scale S_t^T q_t for each query head of a kv-head; a `lax.scan` over tokens from S0 (None: zeros) in
    `dtype`. Returns (o [B, T, Hq, d_v], the final state [B, H, d_k, d_v])."""
    B, _, _, d_k = q.shape
    S0 = jnp.zeros((B, H, d_k, d_v), dtype) if S0 is None else S0.astype(dtype)
    q_TBHgd = rearrange(q.astype(dtype) * scale, "B T (H g) d -> T B H g d", H=H)

    def body(S, x):
        S = update(S, *x[1:])
        return S, jnp.einsum("bhgd,bhde->bhge", x[0], S)

    S, o = jax.lax.scan(body, S0, (q_TBHgd, *(jnp.moveaxis(x.astype(dtype), 1, 0) for x in xs)))
    return rearrange(o, "T B H g e -> B T (H g) e"), S
