"""The gated delta rule's sequential pass from the kernels, under `jax.custom_vjp`.

Forward: `chunk_step.forward_step` over the chunks in order (one kernel, `sequential.py`), saving the state
entering every chunk. Backward: `chunk_step.backward_step` over the chunks in reverse from the final state's
gradient, reading those saved states (no recomputation of states): the gradients of every chunk operand and of the
initial state. The operands' own chain rule is their kernel's (operands.py) and, for the gate factors, the caller's
XLA autodiff.
"""

from functools import partial
from typing import NamedTuple

import jax

from pallas_kernels.gated_delta_rule.chunk_step import backward_step, forward_step
from pallas_kernels.gated_delta_rule.sequential import sequential_pass
from pallas_kernels.power_retention.config import BlockSizes
from pallas_kernels.power_retention.kernel_math import F32, Matmul


class Settings(NamedTuple):
    """Static settings of one call of either kernel (hashable)."""

    backend: str
    blocks: BlockSizes
    mm: Matmul
    interpret: bool


def _pass_args(s: Settings) -> dict:
    return dict(backend=s.backend, blocks=s.blocks, interpret=s.interpret)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def delta_core(s: Settings, q, A, W, U, k_out, gamma, S0):
    """The sequential pass over N chunks of c tokens.

    Args:
        s: the static settings.
        q: q~ [B, H, N, g, c, d_k].
        A: A [B, H, N, g, c, c].
        W: W [B, H, N, c, d_k].
        U: U [B, H, N, c, d_v].
        k_out: the keys decayed to their chunk's end [B, H, N, c, d_k].
        gamma: the chunk decays [B, H, N, 1, 1].
        S0: the initial state [B, H, d_k, d_v] float32.

    Returns:
        (o [B, H, N, g, c, d_v], the final state [B, H, d_k, d_v]), float32.
    """
    return _forward(s, q, A, W, U, k_out, gamma, S0)[0]


def _forward(s: Settings, q, A, W, U, k_out, gamma, S0):
    """((o, S_final), residuals for `_backward`)."""
    g, c, d_k = q.shape[3:]
    d_v = U.shape[-1]
    (o, S_before), S_final = sequential_pass(
        partial(forward_step, g=g, mm=s.mm),
        [q, A, W, U, k_out, gamma],
        S0,
        [((g, c, d_v), F32), ((d_k, d_v), F32)],
        reverse=False,
        **_pass_args(s),
    )
    return (o, S_final), (q, A, W, U, k_out, gamma, S_before)


def _backward(s: Settings, res, cts):
    """Gradients with respect to (q, A, W, U, k_out, gamma, S0) from those of (o, S_final)."""
    q, A, W, U, k_out, gamma, S_before = res
    do, dS_final = cts
    g, c, d_k = q.shape[3:]
    d_v = U.shape[-1]
    shapes = [(g, c, d_k), (g, c, c), (c, d_k), (c, d_v), (c, d_k), (1, 1)]
    grads, dS0 = sequential_pass(
        partial(backward_step, g=g, mm=s.mm),
        [q, A, W, U, k_out, gamma, S_before, do.astype(F32)],
        dS_final.astype(F32),
        [(shape, F32) for shape in shapes],
        reverse=True,
        **_pass_args(s),
    )
    return (*grads, dS0)


delta_core.defvjp(_forward, _backward)
