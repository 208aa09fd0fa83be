"""The public chunked entry point: pad, lay out head-major, run the kernels under their VJP (vjp.py), crop."""

import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float

from pallas_kernels.power_retention.config import (
    BlockSizes,
    check_supported,
    default_block_sizes,
    matmul_precision,
    resolve_backend,
    resolve_interpret,
)
from pallas_kernels.power_retention.vjp import Settings, chunked_core


def chunked_retention(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    log_g: Float[Array, "B T H"] | None,
    S_exp: Float[Array, "B H d d d"],
    Z: Float[Array, "B H d d"],
    *,
    scale: float,
    chunk_size: int,
    interpret: bool | None = None,
    block_sizes: BlockSizes | None = None,
    backend: str | None = None,
) -> tuple[Float[Array, "B T Hq d"], Float[Array, "B H d d d"], Float[Array, "B H d d"]]:
    """Degree-2 power retention over T >= 1 tokens from the expanded state (S_exp, Z) (symmetric, float32; see the
    package docstring), differentiable in every input. Returns (y in v's dtype, the final S_exp and Z).

    `backend` ('gpu' or 'tpu') picks the kernel variant; None means the default device's (the GPU variant on CPU,
    interpreted). `interpret` None means True on CPU. Shapes and values are assumed valid (the caller's op checks
    them); what the kernels do not support raises (`check_supported`)."""
    backend = resolve_backend(backend)
    B, T, Hq, d = q.shape
    H = k.shape[2]
    c = chunk_size
    blocks = block_sizes or default_block_sizes(backend, d)
    check_supported(2, d, Hq // H, backend, c)
    if backend == "gpu" and blocks.rows(d)[1] != d:
        raise ValueError(
            f"BlockSizes.read_rows={blocks.read_rows}: on GPU the output and gradient kernels loop over "
            f"all d={d} rows in one program (grid programs cannot accumulate into one block); use None"
        )
    N = -(-T // c)
    pad = [(0, 0), (0, N * c - T), (0, 0), (0, 0)]
    q_BHgTd = rearrange(jnp.pad(q, pad), "B T (H g) d -> B H g T d", H=H)
    k_BHTd, v_BHTd = (rearrange(jnp.pad(x, pad), "B T H d -> B H T d") for x in (k, v))
    log_g = jnp.zeros((B, T, H), jnp.float32) if log_g is None else log_g.astype(jnp.float32)
    log_g_BHNc = rearrange(jnp.pad(log_g, pad[:3]), "B (N c) H -> B H N c", c=c)
    G_BHT = rearrange(jnp.cumsum(log_g_BHNc, axis=-1), "B H N c -> B H (N c)")
    settings = Settings(c, float(scale), backend, blocks, matmul_precision(q.dtype), resolve_interpret(interpret))
    y, S_exp, Z = chunked_core(settings, q_BHgTd, k_BHTd, v_BHTd, G_BHT, S_exp, Z)
    y = rearrange(y[:, :, :T], "B Hq T d -> B T Hq d")
    return y.astype(v.dtype), S_exp, Z
