"""Chunked power retention in plain JAX: the CPU path, and the fallback on every backend.

T is padded to N chunks of c tokens (zero keys, log-gate 0) and cropped after; gates and resets (log_g,
segment_ids) become per-chunk F and R (`gates.chunk_gates`). Per chunk (`chunk_math`, the reset contract):
- inside it, the quadratic form: A_ij = (q_i . k_j)^p * exp(F_i - F_j) for j <= i in one document, times [v | 1];
- across chunks, the state S = sum phi(k_j) [v_j | 1]^T (z is S's last column): each query before the chunk's
  first reset reads phi(q_i exp(F_i / p)) S, and each key after its last reset adds phi(k_j exp((F_end - F_j)/p))
  [v_j | 1]^T to the state, decayed by exp(F_end) (dropped when the chunk resets). Every exponent is <= 0, so
  nothing overflows at any length.

The intra-chunk part runs batched over groups of chunks (about 16 MB of scores at a time); the state runs as a
`lax.scan` over chunks whose body is rematerialised, so the backward keeps one state per chunk boundary
([B, H, D, d+1] each; per group of chunks once those pass 1 GiB) and never a per-token feature map or anything
T x T. Forward+backward at T=65536, H=8, d=64, p=2: 2.6 GB of temporaries (XLA's memory analysis).
"""

import math

import jax
import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float, Int

from retention.ops.decay import decay_state, gate_factors
from retention.ops.power_retention.chunk_math import intra_chunk, normalise, state_read, state_write
from retention.ops.power_retention.gates import chunk_gates
from retention.ops.power_retention.state import RetentionState, augment, split, with_ones

INTRA_GROUP_BYTES = 1 << 24  # chunks per batched intra-chunk step: about 16 MB of scores at a time


def _intra_chunks(q_NBHgcd, k_NBHcd, v_NBHce, F_NBHc, R_NBHc, deg):
    """`intra_chunk` for all N chunks, batched in groups of ~16 MB of scores, each group rematerialised, so
    neither pass ever holds every chunk's c x c scores: [N, B, H, g, c, e]."""
    _, B, H, g, c, _ = q_NBHgcd.shape
    group = max(1, INTRA_GROUP_BYTES // (4 * B * H * g * c * c))
    one_group = jax.checkpoint(lambda xs: intra_chunk(*xs, deg))
    return jax.lax.map(one_group, (q_NBHgcd, k_NBHcd, v_NBHce, F_NBHc, R_NBHc), batch_size=group)


STATE_BUDGET_BYTES = 1 << 30  # chunk-boundary states the backward may keep (1 GiB) before it regroups


def _state_group(n_chunks: int, state_bytes: int) -> int:
    """Chunks per rematerialised group: 1 (keep every boundary state) while they fit the budget, else the
    power of two nearest sqrt(N), so about 2 sqrt(N) states are alive (one extra forward pass in the backward)."""
    if n_chunks * state_bytes <= STATE_BUDGET_BYTES:
        return 1
    return 1 << round(math.log2(math.sqrt(n_chunks)))


def _inter_chunk(S0_aug, q_NBHmd, k_NBHcd, v_NBHce, chunk_decay_NBH, deg):
    """Scan over chunks: each reads phi(q~) S, then S <- decay S + phi(k~)^T [v|1] (`decay_state`: a decay of 0
    drops S). Returns (S_aug, reads).

    S0_aug None is an empty state: the first chunk reads nothing and its write is the state, so a sequence of one
    chunk needs no scan (and no state at all when the caller drops it). The body is rematerialised, so the
    backward keeps chunk-boundary states only; when those exceed STATE_BUDGET_BYTES the chunks are scanned in
    groups and only group-boundary states are kept (zero chunks with decay 1 pad N to a whole number of groups:
    they read 0 and leave the state as it is).
    """

    @jax.checkpoint
    def body(S_aug, xs):
        q_BHmd, k_BHcd, v_BHce, decay_BH = xs
        read = state_read(q_BHmd, S_aug, deg)
        return decay_state(decay_BH, S_aug) + state_write(k_BHcd, v_BHce, deg), read

    xs = (q_NBHmd, k_NBHcd, v_NBHce, chunk_decay_NBH)
    if S0_aug is None:
        N, B, H, m, _ = q_NBHmd.shape
        first_read = jnp.zeros((1, B, H, m, v_NBHce.shape[-1]), v_NBHce.dtype)
        S_aug = state_write(k_NBHcd[0], v_NBHce[0], deg)
        if N == 1:  # no scan: a dropped state then costs nothing in either pass (through a scan, its zero
            return S_aug, first_read  # cotangent would be made concrete and sent back through phi's VJP)
        S_aug, reads = _scan_chunks(body, S_aug, tuple(x[1:] for x in xs))
        return S_aug, jnp.concatenate([first_read, reads])
    return _scan_chunks(body, S0_aug, xs)


def _scan_chunks(body, S0_aug, xs):
    """lax.scan of `body` over the chunks in xs, regrouped past the state budget (see `_inter_chunk`)."""
    N = xs[0].shape[0]
    group = _state_group(N, S0_aug.size * S0_aug.dtype.itemsize)
    if group == 1:
        return jax.lax.scan(body, S0_aug, xs)
    n_groups = -(-N // group)
    pad = n_groups * group - N
    xs = tuple(jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1), constant_values=c) for x, c in zip(xs, (0, 0, 0, 1)))
    xs = tuple(x.reshape((n_groups, group) + x.shape[1:]) for x in xs)
    S_aug, reads = jax.lax.scan(jax.checkpoint(lambda S, g: jax.lax.scan(body, S, g)), S0_aug, xs)
    return S_aug, reads.reshape((n_groups * group,) + reads.shape[2:])[:N]


def power_retention_chunked(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    log_g: Float[Array, "B T H"] | None,
    initial_state: RetentionState | None,
    *,
    segment_ids: Int[Array, "B T"] | None = None,
    deg: int,
    scale: float,
    chunk_size: int,
) -> tuple[Float[Array, "B T Hq d"], RetentionState]:
    """Power retention over T tokens from `initial_state` (None: empty) in chunks of `chunk_size`, resetting at
    -inf gates and document starts (`gates.chunk_gates`); returns (y, final state).

    Inputs are assumed validated (see `power_retention`); computes in float32 and returns y in v's dtype.
    """
    T = q.shape[1]
    H = k.shape[2]
    c = chunk_size
    gates = chunk_gates(k, v, log_g, segment_ids, chunk_size=c)
    N = gates.F.shape[1]
    pad = [(0, 0), (0, N * c - T), (0, 0), (0, 0)]
    f32 = jnp.float32
    q_f = jnp.pad(q.astype(f32) * scale, pad)
    k_f = jnp.pad(gates.k.astype(f32), pad)
    v_f = jnp.pad(gates.v.astype(f32), pad)
    v_aug = with_ones(v_f)

    q_BNHgcd = rearrange(q_f, "B (N c) (H g) d -> B N H g c d", c=c, H=H)
    k_BNHcd = rearrange(k_f, "B (N c) H d -> B N H c d", c=c)
    v_BNHce = rearrange(v_aug, "B (N c) H e -> B N H c e", c=c)

    chunk_major = lambda x: jnp.moveaxis(x, 1, 0)
    intra = _intra_chunks(*map(chunk_major, (q_BNHgcd, k_BNHcd, v_BNHce, gates.F, gates.R)), deg)

    fq_BNHc, fk_BNHc, decay_BNH = gate_factors(gates.F, gates.R, deg)
    S_aug, reads = _inter_chunk(
        None if initial_state is None else augment(initial_state),
        rearrange(q_BNHgcd * fq_BNHc[:, :, :, None, :, None], "B N H g c d -> N B H (g c) d"),
        rearrange(k_BNHcd * fk_BNHc[..., None], "B N H c d -> N B H c d"),
        rearrange(v_BNHce, "B N H c e -> N B H c e"),
        rearrange(decay_BNH, "B N H -> N B H"),
        deg,
    )
    reads = rearrange(reads, "N B H (g c) e -> B N H g c e", c=c)
    fresh = (gates.R == 0)[:, :, :, None, :, None]  # rows before their chunk's first reset read the state
    total = rearrange(intra, "N B H g c e -> B N H g c e") + jnp.where(fresh, reads, 0.0)
    y = rearrange(normalise(total), "B N H g c d -> B (N c) (H g) d")[:, :T]
    return y.astype(v.dtype), split(S_aug)
