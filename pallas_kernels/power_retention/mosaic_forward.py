"""The chunked forward on Mosaic GPU (Hopper): the state pass and the output kernel, with bf16 wgmma operands
and float32 accumulators, in the same two stages and layouts as the Triton kernels (state_pass.py,
output_kernel.py), so the existing backward (vjp.py) reads what they write.

1. State pass, grid (B, H, d / rows), one warpgroup per program. Each program carries `rows` rows a of the
   expanded state (S_exp[a] [d, e], float32, as wgmma accumulators in registers) through all chunks, which
   `plgpu.emit_pipeline` streams from HBM (two stages): k~^T [d, c] (swizzled), the rows' k~[:, a] [rows, c],
   v [c, e] (swizzled), the chunk's gamma and carry (repeated d times). Per chunk: store each row (bf16) as the
   boundary state `before`, drop or decay it (`carried`), then one wgmma per row, (k~ * k~_a)^T [d, c] (built in
   registers, `feature_lhs`) @ v [c, e].
2. Output kernel, grid (B, Hq, N), one warpgroup per (chunk, query head): q~ [c, d], q, k, v [c, d], F, R and
   the read of the normaliser [c] copied to shared memory once; then a pipeline over the state rows, `rows` per
   step: acc [c, e] += (q~ * q~_a) [c, d] (registers) @ S_before[n, a] [d, e] (swizzled); then the intra-chunk
   part, s = q k^T (wgmma), A = `intra_weights` (registers), num = read-selected acc + A v (wgmma), den,
   y = num / den; y (float32) and den leave through shared memory by TMA.
The gates are applied outside (XLA, O(T d)): k~ = k fk where written, q~ = scale q fq where read, both rounded
to bf16, and the normaliser's read phi(q~) z (its state Z is d times smaller than S) is an XLA einsum passed
in per token. k and v must be finite (the op's `kernel_gates` zeroes non-finite tokens): A v would spread a
non-finite v_j to every row of its chunk. Shapes: d and e multiples of 64 (128-byte swizzled rows of bf16),
the chunk a multiple of 64 (wgmma's M on the query rows, its K in the state pass).

`emulate=True` runs mosaic_emulation.py instead (the same block functions on jnp arrays, for the CPU).
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.power_retention import mosaic_emulation
from pallas_kernels.power_retention.kernel_math import F32
from pallas_kernels.power_retention.mosaic_blocks import (
    carried,
    denominator,
    feature_lhs,
    intra_weights,
    normalised,
    read_mask,
    selected_read,
)
from pallas_kernels.vma import out_struct

WGMMA = plgpu.Layout.WGMMA
ROW = WGMMA.reduce(1)  # a vector with one value per row of a WGMMA array
COL = WGMMA.reduce(0)  # a vector with one value per column
SWIZZLED = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
OPERAND_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
SMEM_BYTES = 227 * 1024  # shared memory one Hopper block may take


def output_smem_bytes(d: int, e: int, chunk: int, rows: int) -> int:
    """Shared memory of one output-kernel program: q~, q, k, v tiles (bf16), five per-token vectors and y
    (float32), two pipeline stages of q~^T rows and state rows (bf16)."""
    return 2 * chunk * (3 * d + e) + 4 * chunk * (5 + e) + 2 * 2 * rows * (chunk + d * e)


def check_mosaic(d: int, e: int, chunk: int, rows: int, dtype) -> None:
    """What the Mosaic forward supports; raises ValueError naming the value."""
    if d % 64 or e % 64:
        raise ValueError(f"head dim d={d}, e={e}: the Mosaic GPU forward needs multiples of 64")
    if chunk % 64:
        raise ValueError(f"chunk_size={chunk}: the Mosaic GPU forward needs a multiple of 64")
    if d % rows:
        raise ValueError(f"BlockSizes.state_rows={rows} must divide the head dim d={d}")
    if (need := output_smem_bytes(d, e, chunk, rows)) > SMEM_BYTES:
        raise ValueError(
            f"chunk_size={chunk} at d={d}, state_rows={rows}: the Mosaic GPU output kernel needs {need} bytes of "
            f"shared memory, more than the {SMEM_BYTES} a Hopper block has; use a smaller chunk or fewer rows"
        )
    if jnp.dtype(dtype) not in OPERAND_DTYPES:
        raise ValueError(f"dtype {jnp.dtype(dtype)}: the Mosaic GPU forward takes bfloat16 or float16 inputs")


def _mma(accs, lhs, rhs_refs):
    """accs[i] + lhs[i] @ rhs_refs[i] for each i (wgmma, register lhs, shared-memory rhs): the new values."""

    def run(acc_refs):
        for acc_ref, x, y in zip(acc_refs, lhs, rhs_refs):
            plgpu.wgmma(acc_ref, x, y)

    return pl.run_state(run)(tuple(plgpu.ACC.init(a) for a in accs))


def _mma_sum(acc, lhs, rhs_refs):
    """acc + sum_i lhs[i] @ rhs_refs[i], the products issued in order onto one accumulator."""

    def run(acc_ref):
        for x, y in zip(lhs, rhs_refs):
            plgpu.wgmma(acc_ref, x, y)

    return pl.run_state(run)(plgpu.ACC.init(acc))


def _state_pass_kernel(kt_ref, v_ref, gamma_ref, carry_ref, init_ref, before_ref, final_ref, *, chunk, rows):
    """One (b, h, row block j) program over all chunks (module docstring). kt [B, H, d, Tp], v [B, H, Tp, e],
    gamma and carry [B, H, N * d], init and final [B, H, d * d, e] float32, before [B, H, N * d * d, e]."""
    b, h, j = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("j")
    d, Tp = kt_ref.shape[2:]
    e = v_ref.shape[-1]
    blocks = d // rows
    mine = pl.ds(j * (rows * d), rows * d)

    def step(_, kt_s, kt_rows_s, v_s, gamma_s, carry_s, before_s, state):
        gamma = plgpu.load(gamma_s, layout=ROW)
        carry = plgpu.load(carry_s, layout=ROW)
        x = plgpu.load(kt_s, layout=WGMMA)
        accs, lhs = [], []
        for i, S in enumerate(state):
            before_s[pl.ds(i * d, d), :] = S.astype(before_s.dtype)
            accs.append(carried(S, gamma, carry))
            lhs.append(feature_lhs(x, plgpu.load(kt_rows_s.at[i], layout=COL), axis=1))
        return _mma(accs, lhs, [v_s] * rows)

    def scoped(state_s, barrier):
        plgpu.copy_gmem_to_smem(init_ref.at[b, h, mine], state_s, barrier)
        plgpu.barrier_wait(barrier)
        init = tuple(plgpu.load(state_s.at[pl.ds(i * d, d)], layout=WGMMA) for i in range(rows))
        pipeline = plgpu.emit_pipeline(
            step,
            grid=(Tp // chunk,),
            in_specs=[
                plgpu.BlockSpec((d, chunk), lambda n: (0, n), transforms=SWIZZLED),
                plgpu.BlockSpec((rows, chunk), lambda n: (j, n)),
                plgpu.BlockSpec((chunk, e), lambda n: (n, 0), transforms=SWIZZLED),
                plgpu.BlockSpec((d,), lambda n: (n,)),
                plgpu.BlockSpec((d,), lambda n: (n,)),
            ],
            out_specs=[plgpu.BlockSpec((rows * d, e), lambda n: (n * blocks + j, 0), transforms=SWIZZLED)],
            max_concurrent_steps=2,
            init_carry=init,
        )
        here = lambda ref: ref.at[b, h]
        final = pipeline(*map(here, (kt_ref, kt_ref, v_ref, gamma_ref, carry_ref, before_ref)))
        for i, S in enumerate(final):
            state_s[pl.ds(i * d, d), :] = S
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(state_s, final_ref.at[b, h, mine])
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(scoped, plgpu.SMEM((rows * d, e), F32), plgpu.Barrier())


def _output_kernel(
    qg_ref, qgt_ref, q_ref, k_ref, v_ref, F_ref, R_ref, den_read_ref, S_ref, y_ref, den_ref, *, chunk, rows, scale, g
):
    """One (b, query head, chunk n) program (module docstring). qg (q~) and q [B, Hq, Tp, d], qgt (q~^T)
    [B, Hq, d, Tp], k and v [B, H, Tp, d], F and R [B, H, Tp], den_read [B, Hq, Tp], S [B, H, N * d * d, e];
    y [B, Hq, Tp, e] and den [B, Hq, Tp] float32."""
    b, head, n = lax.axis_index("b"), lax.axis_index("head"), lax.axis_index("n")
    h = lax.div(head, jnp.asarray(g, head.dtype))
    c, d, e = chunk, q_ref.shape[-1], v_ref.shape[-1]
    blocks = d // rows
    tok = pl.ds(n * c, c)
    sources = (
        qg_ref.at[b, head, tok],
        q_ref.at[b, head, tok],
        k_ref.at[b, h, tok],
        v_ref.at[b, h, tok],
        F_ref.at[b, h, tok],
        R_ref.at[b, h, tok],
        F_ref.at[b, h, tok],
        R_ref.at[b, h, tok],
        den_read_ref.at[b, head, tok],
    )

    def scoped(qg_s, q_s, k_s, v_s, F_s, R_s, F_key_s, R_key_s, den_read_s, y_s, den_s, barrier):
        for src, dst in zip(sources, (qg_s, q_s, k_s, v_s, F_s, R_s, F_key_s, R_key_s, den_read_s)):
            plgpu.copy_gmem_to_smem(src, dst, barrier)
        plgpu.barrier_wait(barrier)
        xq = plgpu.load(qg_s, layout=WGMMA)

        def step(_, qgt_rows_s, S_s, acc):
            lhs = [feature_lhs(xq, plgpu.load(qgt_rows_s.at[i], layout=ROW), axis=0) for i in range(rows)]
            return _mma_sum(acc, lhs, [S_s.at[pl.ds(i * d, d)] for i in range(rows)])

        pipeline = plgpu.emit_pipeline(
            step,
            grid=(blocks,),
            in_specs=[
                plgpu.BlockSpec((rows, c), lambda s: (s, n)),
                plgpu.BlockSpec((rows * d, e), lambda s: (n * blocks + s, 0), transforms=SWIZZLED),
            ],
            max_concurrent_steps=2,
            init_carry=plgpu.layout_cast(jnp.zeros((c, e), F32), WGMMA),
        )
        inter = pipeline(qgt_ref.at[b, head], S_ref.at[b, h])
        F, F_key = plgpu.load(F_s, layout=ROW), plgpu.load(F_key_s, layout=COL)
        R, R_key = plgpu.load(R_s, layout=ROW), plgpu.load(R_key_s, layout=COL)
        read = read_mask(R)

        def scores(acc_ref):
            plgpu.wgmma(acc_ref, q_s, k_s.transpose((1, 0)))
            return acc_ref[...]

        s = pl.run_scoped(scores, plgpu.ACC((c, c), F32))
        ids = [plgpu.broadcasted_iota(jnp.int32, (c, c), axis, layout=WGMMA) for axis in (0, 1)]
        A = intra_weights(s, F, F_key, R, R_key, *ids, scale)
        num = _mma_sum(selected_read(inter, read), [A.astype(q_s.dtype)], [v_s])
        den = denominator(A, plgpu.load(den_read_s, layout=ROW), read)
        y_s[...] = normalised(num, den)
        den_s[...] = den
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(y_s, y_ref.at[b, head, tok])
        plgpu.copy_smem_to_gmem(den_s, den_ref.at[b, head, tok])
        plgpu.wait_smem_to_gmem(0)

    dt = q_ref.dtype
    pl.run_scoped(
        scoped,
        plgpu.SMEM((c, d), dt, transforms=SWIZZLED),
        plgpu.SMEM((c, d), dt, transforms=SWIZZLED),
        plgpu.SMEM((c, d), dt, transforms=SWIZZLED),
        plgpu.SMEM((c, e), dt, transforms=SWIZZLED),
        *[plgpu.SMEM((c,), F32)] * 5,
        plgpu.SMEM((c, e), F32),
        plgpu.SMEM((c,), F32),
        plgpu.Barrier(num_arrivals=len(sources)),
    )


def state_pass(kt, v, gamma, carry, init, *, chunk: int, rows: int, emulate: bool):
    """Forward boundary states. kt [B, H, d, Tp] (k~^T, bf16), v [B, H, Tp, e], gamma and carry [B, H, N * d]
    float32 (each chunk's value repeated d times), init [B, H, d * d, e] float32. Returns (before
    [B, H, N * d * d, e] in kt's dtype, final [B, H, d * d, e] float32)."""
    if emulate:
        return mosaic_emulation.state_pass(kt, v, gamma, carry, init, chunk=chunk)
    B, H, d, Tp = kt.shape
    e = v.shape[-1]
    out_type = (out_struct((B, H, Tp // chunk * d * d, e), kt.dtype, kt), out_struct((B, H, d * d, e), F32, kt))
    kernel = plgpu.kernel(
        partial(_state_pass_kernel, chunk=chunk, rows=rows),
        out_type=out_type,
        grid=(B, H, d // rows),
        grid_names=("b", "h", "j"),
    )
    return kernel(kt, v, gamma, carry, init)


def output(qg, qgt, q, k, v, F, R, den_read, S_before, *, chunk: int, rows: int, scale: float, emulate: bool):
    """Normalised output per chunk. qg (q~), q [B, Hq, Tp, d] and qgt (q~^T) [B, Hq, d, Tp] bf16, k and v
    [B, H, Tp, d], F and R [B, H, Tp] float32, den_read [B, Hq, Tp] float32, S_before [B, H, N * d * d, e].
    Returns (y [B, Hq, Tp, e], den [B, Hq, Tp]) float32."""
    if emulate:
        return mosaic_emulation.output(qg, qgt, q, k, v, F, R, den_read, S_before, chunk=chunk, scale=scale)
    B, Hq, Tp, _ = q.shape
    H, e = k.shape[1], v.shape[-1]
    kernel = plgpu.kernel(
        partial(_output_kernel, chunk=chunk, rows=rows, scale=scale, g=Hq // H),
        out_type=(out_struct((B, Hq, Tp, e), F32, q), out_struct((B, Hq, Tp), F32, q)),
        grid=(B, Hq, Tp // chunk),
        grid_names=("b", "head", "n"),
    )
    return kernel(qg, qgt, q, k, v, F, R, den_read, S_before)


def boundary_states(k_t, v, gamma, carry, S0, *, chunk: int, rows: int, emulate: bool):
    """The forward state pass from XLA's layouts: k_t (k~) [B, H, Tp, d] float32, v [B, H, Tp, e] (bf16),
    gamma and carry [B, H, N, 1, 1], S0 [B, H, d, d, e] float32. Returns (S_before [B, H, N, d, d, e] in v's
    dtype, S_final [B, H, d, d, e] float32), as state_pass.state_pass."""
    B, H, Tp, d = k_t.shape
    e, N = v.shape[-1], Tp // chunk
    per_row = lambda x: jnp.repeat(x[..., 0, 0], d, axis=-1)
    kt = jnp.swapaxes(k_t, 2, 3).astype(v.dtype)
    before, final = state_pass(
        kt, v, per_row(gamma), per_row(carry), S0.reshape(B, H, d * d, e), chunk=chunk, rows=rows, emulate=emulate
    )
    return before.reshape(B, H, N, d, d, e), final.reshape(B, H, d, d, e)


def chunk_outputs(q, k, v, F, R, fq, read, S_before, Z_before, *, chunk: int, rows: int, scale: float, emulate):
    """The output kernel from XLA's layouts: q [B, H, g, Tp, d], k and v [B, H, Tp, d], F and R [B, H, Tp],
    fq and read [B, H, Tp, 1] (vjp.ChunkGates), S_before [B, H, N, d, d, e], Z_before [B, H, N, d, d] float32.
    Returns (y [B, Hq, Tp, e], den [B, Hq, Tp, 1]) float32, as output_kernel.output_chunks."""
    B, H, g, Tp, d = q.shape
    e = v.shape[-1]
    q_t = jnp.where(read[:, :, None] > 0, q.astype(F32) * fq[:, :, None], 0.0)
    q_c = q_t.reshape(B, H, g, Tp // chunk, chunk, d)
    qZ = jnp.einsum("bhgncx,bhnxy->bhgncy", q_c, Z_before, precision=jax.lax.Precision.HIGHEST)
    den_read = jnp.sum(qZ * q_c, axis=-1).reshape(B, H * g, Tp)
    qg = q_t.astype(q.dtype).reshape(B, H * g, Tp, d)
    y, den = output(
        qg,
        jnp.swapaxes(qg, 2, 3),
        q.reshape(B, H * g, Tp, d),
        k,
        v,
        F,
        R,
        den_read,
        S_before.reshape(B, H, -1, e),
        chunk=chunk,
        rows=rows,
        scale=scale,
        emulate=emulate,
    )
    return y, den[..., None]
