"""Decode: n >= 1 new tokens as one chunk against the state, reading and updating S in its exact [D, e] layout.

Decode is bound by the pass over S (D * e floats per kv-head), so the kernel reads and writes S once, in its own
layout: for each a (descending), the d-row window of phi's layout that starts at off(a) - a holds the entries
(a, b) at row b for b >= a (layout.row_starts); masked to b >= a and weighted by sqrt(2) off the diagonal, it is
row a's share of phi. Each program (b, kv-head, column block) loops over the d windows, adds (q~ * q~_a * w) @ W
to the read and writes gamma W + (k~ * k~_a * w)^T v back to rows b >= a: a masked store on GPU, where warps are
not in lockstep; on TPU the block lives in VMEM, and the descending order lets the windows that own rows b < a
overwrite what an earlier window wrote back there unchanged.
Everything of size D or n^2 (z, its read, the intra-chunk terms, normalising) is done by XLA around the kernel.
Gradients (rarely needed at decode) come from the XLA step, `retention.ops.recurrent.chunk_step`.
"""

from functools import partial

import jax
import jax.numpy as jnp
from einops import rearrange
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.power_retention.chunk_math import F32, column, dot
from pallas_kernels.power_retention.config import matmul_precision, resolve_backend, resolve_interpret
from pallas_kernels.power_retention.forward import check_kernel_shapes
from pallas_kernels.power_retention.layout import row_starts
from retention.ops.recurrent import RetentionState, chunk_step, normalise
from retention.ops.sympow import sympow


def _kernel(q_ref, k_ref, v_ref, gamma_ref, S_ref, read_ref, S_out_ref, *, masked_store, precision):
    """read [m, e] = phi(q~) S and S_out = gamma S + phi(k~)^T v, window by window (see the module docstring)."""
    d = q_ref.shape[1]
    q_t, k_t, v = q_ref[...], k_ref[...], v_ref[...]
    gamma = gamma_ref[...]
    lane = jax.lax.broadcasted_iota(jnp.int32, (1, d), 1)
    sublane = jax.lax.broadcasted_iota(jnp.int32, (d, S_ref.shape[1]), 0)
    read = jnp.zeros(read_ref.shape, F32)
    for a, start in reversed(list(enumerate(row_starts(d).tolist()))):
        weight = jnp.where(lane > a, 2.0**0.5, jnp.where(lane == a, 1.0, 0.0))
        window = pl.ds(start, d)
        W = S_ref[window, :]
        read = read + dot(q_t * column(q_t, a) * weight, W, precision)
        new = gamma * W + dot(k_t * column(k_t, a) * weight, v, precision, trans_x=True)
        if masked_store:
            pltriton.store(S_out_ref.at[window, :], new, mask=sublane >= a)
        else:
            S_out_ref[window, :] = jnp.where(sublane >= a, new, W)
    read_ref[...] = read


def _state_kernel_call(q_t, k_t, v, gamma, S, *, backend, precision, interpret):
    """q~ [B, H, m, d], k~ [B, H, r, d], v [B, H, r, e], gamma [B, H, 1, 1] float32, S [B, H, D, e].
    Returns (phi(q~) S [B, H, m, e], gamma S + phi(k~)^T v [B, H, D, e]).

    Grid (B, H, column blocks of S): the columns are independent, so on GPU blocks of 16 columns give 4x more
    programs at e = 64 (decode streams S once and wants many SMs); on TPU one block of all e lanes."""
    B, H, m, d = q_t.shape
    r, (D, e) = k_t.shape[2], S.shape[2:]
    cols = min(16, e) if backend == "gpu" else e
    spec = lambda rows, width, by_col: pl.BlockSpec((None, None, rows, width),
                                                    lambda b, h, c: (b, h, 0, c if by_col else 0))
    params = (pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel")) if backend == "tpu"
              else pltriton.CompilerParams(num_warps=4, num_stages=1))
    return pl.pallas_call(
        partial(_kernel, masked_store=backend == "gpu", precision=precision),
        grid=(B, H, e // cols),
        in_specs=[spec(m, d, False), spec(r, d, False), spec(r, cols, True), spec(1, 1, False), spec(D, cols, True)],
        out_specs=[spec(m, cols, True), spec(D, cols, True)],
        out_shape=(jax.ShapeDtypeStruct((B, H, m, e), F32), jax.ShapeDtypeStruct((B, H, D, e), F32)),
        compiler_params=params,
        interpret=interpret,
    )(q_t, k_t, v, gamma, S)


def _pad_rows(x, rows):
    return jnp.pad(x, [(0, 0), (0, 0), (0, rows - x.shape[2]), (0, 0)])


def _rows_for(n: int, backend: str) -> int:
    """Row count the kernel's matmuls get: a power of two >= 16 (Triton), a multiple of 8 (TPU)."""
    return max(16, 1 << (n - 1).bit_length()) if backend == "gpu" else -(-n // 8) * 8


def _step(state, q, k, v, log_g, scale, backend, interpret):
    """Forward of the decode step; see `power_retention_step_pallas`."""
    B, n, Hq, d = q.shape
    H = k.shape[2]
    f32 = jnp.float32
    log_g = jnp.zeros((B, n, H), f32) if log_g is None else log_g.astype(f32)
    G_BHn = jnp.cumsum(rearrange(log_g, "B n H -> B H n"), axis=-1)
    G_end = G_BHn[..., -1:]
    q_BHgnd = rearrange(q.astype(f32) * scale, "B n (H g) d -> B H g n d", H=H)
    k_BHnd, v_BHnd = (rearrange(x.astype(f32), "B n H d -> B H n d") for x in (k, v))
    q_t = q_BHgnd * jnp.exp(G_BHn / 2)[:, :, None, :, None]
    k_t = k_BHnd * jnp.exp((G_end - G_BHn) / 2)[..., None]
    gamma = jnp.exp(G_end)

    m = q_t.shape[2] * n
    rows_q, rows_k = _rows_for(m, backend), _rows_for(n, backend)
    read, S = _state_kernel_call(
        _pad_rows(rearrange(q_t, "B H g n d -> B H (g n) d"), rows_q), _pad_rows(k_t, rows_k),
        _pad_rows(v_BHnd, rows_k), gamma[..., None], state.S.astype(f32),
        backend=backend, precision=matmul_precision(q.dtype), interpret=interpret)
    read = rearrange(read[:, :, :m], "B H (g n) e -> B H g n e", n=n)

    phi_q = sympow(q_t, 2)
    causal = jnp.tril(jnp.ones((n, n), dtype=bool))
    decay = jnp.where(causal, jnp.exp(jnp.where(causal, G_BHn[..., :, None] - G_BHn[..., None, :], 0.0)), 0.0)
    A = jnp.einsum("bhgid,bhjd->bhgij", q_BHgnd, k_BHnd) ** 2 * decay[:, :, None]
    num = read + jnp.einsum("bhgij,bhjd->bhgid", A, v_BHnd)
    den = jnp.einsum("bhgnD,bhD->bhgn", phi_q, state.z) + A.sum(-1)
    y = normalise(jnp.concatenate([num, den[..., None]], axis=-1))
    z = gamma * state.z + sympow(k_t, 2).sum(axis=2)
    return rearrange(y, "B H g n d -> B n (H g) d").astype(v.dtype), RetentionState(S=S, z=z)


@partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _step_vjp(state, q, k, v, log_g, scale, backend, interpret):
    return _step(state, q, k, v, log_g, scale, backend, interpret)


def _step_fwd(state, q, k, v, log_g, scale, backend, interpret):
    return _step(state, q, k, v, log_g, scale, backend, interpret), (state, q, k, v, log_g)


def _step_bwd(scale, backend, interpret, res, cts):
    state, q, k, v, log_g = res
    _, vjp = jax.vjp(lambda *args: chunk_step(*args, deg=2, scale=scale), state, q, k, v, log_g)
    return vjp(cts)


_step_vjp.defvjp(_step_fwd, _step_bwd)


def power_retention_step_pallas(state: RetentionState, q, k, v, log_g, *, deg: int, scale: float,
                                interpret: bool | None = None, backend: str | None = None):
    """Decode n >= 1 tokens (q [B, n, Hq, d], k and v [B, n, H, d], log_g [B, n, H] or None) against `state`
    (validated by the op): row i of y equals row t0 + i of the full forward. Returns (y in v's dtype, new state)."""
    backend = resolve_backend(backend)
    d = q.shape[-1]
    check_kernel_shapes(deg, d, q.shape[2] // k.shape[2], backend)
    return _step_vjp(state, q, k, v, log_g, float(scale), backend, resolve_interpret(interpret))
