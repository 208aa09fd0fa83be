"""The public chunked entry point: pad, lay out head-major, run the kernels under their VJP (vjp.py), crop."""

import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float

from pallas_kernels.power_retention.config import (
    BlockSizes,
    check_supported,
    default_block_sizes,
    matmul_for,
    resolve_backend,
    resolve_interpret,
)
from pallas_kernels.power_retention.mosaic_forward import check_mosaic
from pallas_kernels.power_retention.vjp import Settings, chunked_core
from pallas_kernels.vma import same_varying


def chunked_retention(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    F: Float[Array, "B T H"],
    R: Float[Array, "B T H"],
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
    package docstring), differentiable in every input but R. Returns (y in v's dtype, the final S_exp and Z).

    F and R are the gates per chunk of `chunk_size` tokens (the package docstring): float32 [B, T, H], the last
    partial chunk's padding continues them (a = 0, no reset). `backend` ('gpu' or 'tpu') picks the kernel variant;
    None means the default device's (the GPU variant on CPU, interpreted). `interpret` None means True on CPU.
    `block_sizes.forward` picks the GPU forward's kernels (Triton, or Mosaic GPU, which runs its jnp emulation
    where `interpret`).
    Shapes and values are assumed valid (the caller's op checks them); what the kernels do not support raises
    (`check_supported`). Inside `jax.shard_map` the inputs are made to vary over the same mesh axes first."""
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
    if blocks.forward == "mosaic":
        if backend != "gpu":
            raise ValueError(f"BlockSizes.forward='mosaic' is a GPU kernel; backend={backend!r}")
        check_mosaic(d, v.shape[-1], c, blocks.rows(d)[0], q.dtype)
    q, k, v, F, R, S_exp, Z = same_varying(q, k, v, F, R, S_exp, Z)
    N = -(-T // c)
    pad = [(0, 0), (0, N * c - T), (0, 0), (0, 0)]
    q_BHgTd = rearrange(jnp.pad(q, pad), "B T (H g) d -> B H g T d", H=H)
    k_BHTd, v_BHTd = (rearrange(jnp.pad(x, pad), "B T H d -> B H T d") for x in (k, v))
    F_BHT, R_BHT = (rearrange(jnp.pad(x.astype(jnp.float32), pad[:3], mode="edge"), "B T H -> B H T") for x in (F, R))
    settings = Settings(c, float(scale), backend, blocks, matmul_for(q.dtype), resolve_interpret(interpret))
    y, S_exp, Z = chunked_core(settings, q_BHgTd, k_BHTd, v_BHTd, F_BHT, R_BHT, S_exp, Z)
    y = rearrange(y[:, :, :T], "B Hq T d -> B T Hq d")
    return y.astype(v.dtype), S_exp, Z
