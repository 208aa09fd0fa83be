"""The gated delta rule's per-chunk WY/UT operands (A, W, U; wy_math.py) from kernels, under `jax.custom_vjp`.

Forward: one kernel per chunk, grid (B, H, N), every axis parallel, the g query heads of a kv-head in one program
(static loop). Backward: one kernel per chunk from the saved W and U: the gradients of q, k, v, beta and F. beta, F
and R enter both as columns [c, 1] and rows [1, c] (the kernels need no transpose); the gradients of beta and F come
back whole through the column views (and F's row share through its row view), the other views get none.
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.gated_delta_rule.vjp import Settings
from pallas_kernels.gated_delta_rule.wy_math import operand_grads, operands
from pallas_kernels.power_retention.config import compiler_params
from pallas_kernels.power_retention.kernel_math import F32
from pallas_kernels.vma import out_struct


def _per_chunk(kernel, inputs: list, outputs: list, s: Settings):
    """pallas_call of `kernel` over the grid (B, H, N) of [B, H, N, ...] inputs, one chunk's blocks each; `outputs`
    the per-chunk (shape, dtype) of each result."""
    B, H, N = inputs[0].shape[:3]
    spec = lambda tail: pl.BlockSpec((None, None, None, *tail), lambda b, h, n: (b, h, n) + (0,) * len(tail))
    return pl.pallas_call(
        kernel,
        grid=(B, H, N),
        in_specs=[spec(x.shape[3:]) for x in inputs],
        out_specs=[spec(shape) for shape, _ in outputs],
        out_shape=[out_struct((B, H, N, *shape), dtype, inputs[0]) for shape, dtype in outputs],
        compiler_params=compiler_params(s.backend, s.blocks, ("parallel",) * 3),
        interpret=s.interpret,
    )(*inputs)


def _forward_kernel(q_ref, k_ref, v_ref, bc_ref, br_ref, Fc_ref, Fr_ref, Rc_ref, Rr_ref, A_ref, W_ref, U_ref, *, mm):
    qs = [q_ref[r] for r in range(q_ref.shape[0])]
    views = (ref[...] for ref in (k_ref, v_ref, bc_ref, br_ref, Fc_ref, Fr_ref, Rc_ref, Rr_ref))
    As, W_ref[...], U_ref[...] = operands(qs, *views, mm)
    for r, A in enumerate(As):
        A_ref[r] = A


def _backward_kernel(
    q_ref, k_ref, v_ref, bc_ref, Fc_ref, Fr_ref, Rc_ref, Rr_ref, W_ref, U_ref, dA_ref, dW_ref, dU_ref, *out_refs, mm
):
    dq_ref, dk_ref, dv_ref, dbeta_ref, dFc_ref, dFr_ref = out_refs
    g = q_ref.shape[0]
    views = [ref[...] for ref in (k_ref, v_ref, bc_ref, Fc_ref, Fr_ref, Rc_ref, Rr_ref, U_ref, W_ref, dU_ref, dW_ref)]
    qs, dAs = [q_ref[r] for r in range(g)], [dA_ref[r] for r in range(g)]
    dqs, dk_ref[...], dv_ref[...], dbeta_ref[...], dFc_ref[...], dFr_ref[...] = operand_grads(qs, *views, dAs, mm)
    for r, dq in enumerate(dqs):
        dq_ref[r] = dq


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def operands_core(s: Settings, q, k, v, beta_c, beta_r, Fc, Fr, Rc, Rr):
    """Every chunk's operands.

    Args:
        s: the static settings.
        q: the scaled queries [B, H, N, g, c, d_k] float32.
        k: keys [B, H, N, c, d_k] float32.
        v: values [B, H, N, c, d_v] float32.
        beta_c: the write strengths [B, H, N, c, 1].
        beta_r: the same as rows [B, H, N, 1, c].
        Fc: the cumulative log-gates per chunk [B, H, N, c, 1].
        Fr: the same as rows [B, H, N, 1, c].
        Rc: the reset counts per chunk [B, H, N, c, 1] float32 (no gradient).
        Rr: the same as rows [B, H, N, 1, c].

    Returns:
        (A [B, H, N, g, c, c], W [B, H, N, c, d_k], U [B, H, N, c, d_v]), float32.
    """
    return _forward(s, q, k, v, beta_c, beta_r, Fc, Fr, Rc, Rr)[0]


def _forward(s: Settings, q, k, v, beta_c, beta_r, Fc, Fr, Rc, Rr):
    g, c, d_k = q.shape[3:]
    outputs = [((g, c, c), F32), ((c, d_k), F32), ((c, v.shape[-1]), F32)]
    A, W, U = _per_chunk(partial(_forward_kernel, mm=s.mm), [q, k, v, beta_c, beta_r, Fc, Fr, Rc, Rr], outputs, s)
    return (A, W, U), (q, k, v, beta_c, Fc, Fr, Rc, Rr, W, U)


def _backward(s: Settings, res, cts):
    q, k, v, beta_c, Fc, Fr, Rc, Rr, W, U = res
    dA, dW, dU = cts
    g, c, d_k = q.shape[3:]
    outputs = [
        ((g, c, d_k), F32),
        ((c, d_k), F32),
        ((c, v.shape[-1]), F32),
        ((c, 1), F32),
        ((c, 1), F32),
        ((1, c), F32),
    ]
    inputs = [q, k, v, beta_c, Fc, Fr, Rc, Rr, W, U, dA, dW, dU]
    dq, dk, dv, dbeta, dFc, dFr = _per_chunk(partial(_backward_kernel, mm=s.mm), inputs, outputs, s)
    zero = jnp.zeros_like
    return dq, dk, dv, dbeta, zero(beta_c).reshape(beta_c.shape[:3] + (1, c)), dFc, dFr, zero(Rc), zero(Rr)


operands_core.defvjp(_forward, _backward)
