"""Decode: the pass over the state S for n >= 1 new tokens as one chunk, reading and updating S in its exact layout.

S is [B, H, D, e] with D = d (d + 1) / 2 rows in the order of the degree-2 symmetric power map: row off(a) + (b - a)
holds the entry (a, b), a <= b (lexicographic, off(a) = sum_{a' < a} (d - a')), and the feature of a token x is
x_a x_b, times sqrt(2) off the diagonal. Decode is bound by this pass (D * e floats per kv-head), so the kernel reads
and writes S once, in that layout: for each a (descending), the d-row window that starts at off(a) - a holds the
entries (a, b) at row b for b >= a (`row_starts`); masked to b >= a and weighted by sqrt(2) off the diagonal, it is
row a's share of the feature map. Each program (b, kv-head, column block) loops over the d windows, adds
(q~ * q~_a * w) @ W to the read and writes gamma W + (k~ * k~_a * w)^T v back to rows b >= a: a masked store on GPU,
where warps are not in lockstep; on TPU the block lives in VMEM, and the descending order lets the windows that own
rows b < a overwrite what an earlier window wrote back there unchanged.
Only this pass is a kernel: everything of size D or n^2 (the normaliser's state z, the intra-chunk terms,
normalising) is the caller's, in XLA, and so is the gradient (`decode_state_pass` defines none).
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
from jaxtyping import Array, Float

from pallas_kernels.power_retention.config import (
    BlockSizes,
    check_supported,
    compiler_params,
    default_block_sizes,
    resolve_backend,
    resolve_interpret,
)
from pallas_kernels.power_retention.kernel_math import F32, Matmul, column, dot
from pallas_kernels.vma import out_struct, same_varying


def row_starts(d: int) -> np.ndarray:
    """For each a, the first row of S whose window of d rows holds the entries (a, b >= a) at offset b:
    off(a) - a. Rows b < a of that window belong to rows a' < a."""
    a = np.arange(d)
    return a * d - a * (a - 1) // 2 - a


def _kernel(q_ref, k_ref, v_ref, gamma_ref, S_ref, read_ref, S_out_ref, *, masked_store, precision):
    """read [m, e] = phi(q~) S and S_out = gamma S + phi(k~)^T v, window by window (see the module docstring)."""
    d = q_ref.shape[1]
    q_t, k_t, v = q_ref[...], k_ref[...], v_ref[...]
    gamma = gamma_ref[...]
    lane = jax.lax.broadcasted_iota(jnp.int32, (1, d), 1)
    sublane = jax.lax.broadcasted_iota(jnp.int32, (d, S_ref.shape[1]), 0)
    read = jnp.zeros(read_ref.shape, F32)
    mm = Matmul(F32, precision)
    for a, start in reversed(list(enumerate(row_starts(d).tolist()))):
        weight = jnp.where(lane > a, 2.0**0.5, jnp.where(lane == a, 1.0, 0.0))
        window = pl.ds(start, d)
        W = S_ref[window, :]
        read = read + dot(q_t * column(q_t, a) * weight, W, mm)
        new = gamma * W + dot(k_t * column(k_t, a) * weight, v, mm, trans_x=True)
        if masked_store:
            pltriton.store(S_out_ref.at[window, :], new, mask=sublane >= a)
        else:
            S_out_ref[window, :] = jnp.where(sublane >= a, new, W)
    read_ref[...] = read


def _pad_rows(x, rows):
    return jnp.pad(x, [(0, 0), (0, 0), (0, rows - x.shape[2]), (0, 0)])


def _rows_for(n: int, backend: str) -> int:
    """Row count the kernel's matmuls get: a power of two >= 16 (Triton), a multiple of 8 (TPU)."""
    return max(16, 1 << (n - 1).bit_length()) if backend == "gpu" else -(-n // 8) * 8


def decode_state_pass(
    q_t: Float[Array, "B H m d"],
    k_t: Float[Array, "B H n d"],
    v: Float[Array, "B H n e"],
    gamma: Float[Array, "B H"],
    S: Float[Array, "B H D e"],
    *,
    precision: jax.lax.Precision = jax.lax.Precision.HIGHEST,
    interpret: bool | None = None,
    block_sizes: BlockSizes | None = None,
    backend: str | None = None,
) -> tuple[Float[Array, "B H m e"], Float[Array, "B H D e"]]:
    """(phi(q~) S, gamma S + phi(k~)^T v) for the m query rows q~ and the n keys k~ (already scaled and gated) of
    one chunk, float32, S in the layout of the module docstring. Not differentiable (the caller defines the
    gradient). `backend`, `interpret` as in `chunked_retention`; `precision` of the kernel's matmuls (float32
    operands: the pass is bound by reading S, which is float32). Inside `jax.shard_map` the inputs are made to vary
    over the same mesh axes first."""
    backend = resolve_backend(backend)
    q_t, k_t, v, gamma, S = same_varying(q_t, k_t, v, gamma, S)
    B, H, m, d = q_t.shape
    n, (D, e) = k_t.shape[2], S.shape[2:]
    check_supported(2, d, 1, backend)
    blocks = block_sizes or default_block_sizes(backend, d)
    cols = blocks.cols(e)
    rows_q, rows_k = _rows_for(m, backend), _rows_for(n, backend)
    spec = lambda rows, width, by_col: pl.BlockSpec(
        (None, None, rows, width), lambda b, h, c: (b, h, 0, c if by_col else 0)
    )
    read, S = pl.pallas_call(
        partial(_kernel, masked_store=backend == "gpu", precision=precision),
        grid=(B, H, e // cols),
        in_specs=[
            spec(rows_q, d, False),
            spec(rows_k, d, False),
            spec(rows_k, cols, True),
            spec(1, 1, False),
            spec(D, cols, True),
        ],
        out_specs=[spec(rows_q, cols, True), spec(D, cols, True)],
        out_shape=(out_struct((B, H, rows_q, e), F32, S), out_struct((B, H, D, e), F32, S)),
        compiler_params=compiler_params(backend, blocks, ("parallel", "parallel", "parallel"), decode=True),
        interpret=resolve_interpret(interpret),
    )(
        _pad_rows(q_t.astype(F32), rows_q),
        _pad_rows(k_t.astype(F32), rows_k),
        _pad_rows(v.astype(F32), rows_k),
        gamma.astype(F32)[..., None, None],
        S.astype(F32),
    )
    return read[:, :, :m], S
