"""The public entry points of the gated delta rule's kernels: check, lay out head-major, run the chunks' operands
(operands.py) and the sequential pass (vjp.py) under their VJPs."""

import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float

from pallas_kernels.gated_delta_rule import operands
from pallas_kernels.gated_delta_rule.vjp import Settings, delta_core
from pallas_kernels.matrix_state import check_supported
from pallas_kernels.power_retention.config import BlockSizes, matmul_for, resolve_backend, resolve_interpret
from pallas_kernels.vma import same_varying


def _settings(q, d_v: int, backend, interpret, block_sizes) -> Settings:
    """The kernels' settings for queries q [B, N, H, g, c, d_k] and d_v value columns (float32 operands, exact
    matmuls), after `check_supported`."""
    backend = resolve_backend(backend)
    g, c, d_k = q.shape[3:]
    check_supported(d_k, d_v, g, c, backend)
    blocks = block_sizes or BlockSizes(None, None)
    return Settings(backend, blocks, matmul_for(jnp.float32), resolve_interpret(interpret))


def _head_major(x):
    """[B, N, H, ...] -> [B, H, N, ...] float32."""
    return jnp.moveaxis(x.astype(jnp.float32), 2, 1)


def chunked_delta(
    q: Float[Array, "B N H g c dk"],
    A: Float[Array, "B N H g c c"],
    W: Float[Array, "B N H c dk"],
    U: Float[Array, "B N H c dv"],
    k_out: Float[Array, "B N H c dk"],
    gamma: Float[Array, "B N H"],
    S0: Float[Array, "B H dk dv"],
    *,
    interpret: bool | None = None,
    backend: str | None = None,
    block_sizes: BlockSizes | None = None,
) -> tuple[Float[Array, "B N H g c dv"], Float[Array, "B H dk dv"]]:
    """The gated delta rule's pass over chunks from S0 (the package docstring), differentiable in every input.

    Args:
        q: q~ = scale q exp(F) per chunk, 0 after the chunk's first reset.
        A: Q K^T times the intra-chunk decay, per chunk and query head.
        W: (I + L)^-1 diag(beta exp(F)) K per chunk.
        U: (I + L)^-1 diag(beta) V per chunk.
        k_out: the keys decayed to their chunk's end, 0 outside its last document.
        gamma: each chunk's decay of the carried state, 0 where the chunk resets.
        S0: the initial state float32.
        interpret: run in interpret mode; None: on a CPU.
        backend: "gpu" or "tpu" kernels; None: the default device's (GPU's on a CPU).
        block_sizes: Triton's warps and stages (its other fields are not read); None: the defaults.

    Returns:
        (o [B, N, H, g, c, d_v], the final state [B, H, d_k, d_v]), float32.

    Raises:
        ValueError: a shape the kernels of `backend` do not support (`check_supported`), naming it.
    """
    settings = _settings(q, U.shape[-1], backend, interpret, block_sizes)
    q, A, W, U, k_out, gamma, S0 = same_varying(q, A, W, U, k_out, gamma, S0)
    args = (_head_major(x) for x in (q, A, W, U, k_out, gamma[..., None, None]))
    o, S = delta_core(settings, *args, S0)
    return jnp.moveaxis(o, 1, 2), S


def chunk_operands(
    q: Float[Array, "B N H g c dk"],
    k: Float[Array, "B N H c dk"],
    v: Float[Array, "B N H c dv"],
    beta: Float[Array, "B N H c"],
    F: Float[Array, "B N H c"],
    R: Float[Array, "B N H c"],
    *,
    interpret: bool | None = None,
    backend: str | None = None,
    block_sizes: BlockSizes | None = None,
) -> tuple[Float[Array, "B N H g c c"], Float[Array, "B N H c dk"], Float[Array, "B N H c dv"]]:
    """Every chunk's A = Q K^T * D, W and U (wy_math.py), differentiable in every input but R.

    Args:
        q: the scaled queries per chunk.
        k: keys (finite: the caller zeroes bad tokens).
        v: values (likewise).
        beta: the write strengths.
        F: the cumulative log-gates per chunk, finite and non-increasing in a chunk.
        R: the reset counts per chunk (any float or int dtype).
        interpret: run in interpret mode; None: on a CPU.
        backend: "gpu" or "tpu" kernels; None: the default device's (GPU's on a CPU).
        block_sizes: Triton's warps and stages (its other fields are not read); None: the defaults.

    Returns:
        (A, W, U), float32.

    Raises:
        ValueError: a shape the kernels of `backend` do not support (`check_supported`), naming it.
    """
    settings = _settings(q, v.shape[-1], backend, interpret, block_sizes)
    q, k, v, beta, F, R = same_varying(q, k, v, beta, F, R)
    column = lambda x: _head_major(x)[..., None]
    as_row = lambda x: rearrange(_head_major(x), "B H N c -> B H N 1 c")
    A, W, U = operands.operands_core(
        settings,
        _head_major(q),
        _head_major(k),
        _head_major(v),
        column(beta),
        as_row(beta),
        column(F),
        as_row(F),
        column(R),
        as_row(R),
    )
    return tuple(jnp.moveaxis(x, 1, 2) for x in (A, W, U))
