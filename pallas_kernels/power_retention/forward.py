"""The public chunked entry point: pad, lay out head-major, expand the state, run the kernels, crop."""

import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float

from pallas_kernels.power_retention.config import (BlockSizes, default_block_sizes, matmul_precision, resolve_backend,
                                                   resolve_interpret)
from pallas_kernels.power_retention.forward_backward import Settings, chunked_core
from pallas_kernels.power_retention.layout import from_expanded, to_expanded
from retention.ops.recurrent import RetentionState

SUPPORTED_DEGREES = (2,)


def check_kernel_shapes(deg: int, d: int, g: int, backend: str, chunk: int | None = None) -> None:
    """What the kernels support beyond the op's own validation; raises naming the value and what is allowed."""
    if deg not in SUPPORTED_DEGREES:
        raise NotImplementedError(
            f"deg={deg}: the Pallas kernels support degrees {SUPPORTED_DEGREES} (the expanded degree-4 state, d^4 x d "
            f"floats, does not fit on chip); use impl='xla'")
    pow2 = lambda n: n >= 1 and n & (n - 1) == 0
    if backend == "gpu":
        if not (pow2(d) and d >= 16):
            raise ValueError(f"head dim d={d}: Triton kernels need a power of two >= 16")
        if not pow2(g):
            raise ValueError(f"query heads per kv-head {g}: Triton kernels need a power of two")
        if chunk is not None and not (pow2(chunk) and chunk >= 16):
            raise ValueError(f"chunk_size={chunk}: Triton kernels need a power of two >= 16")
    elif chunk is not None and chunk % 8:
        raise ValueError(f"chunk_size={chunk}: TPU kernels need a multiple of 8")


def power_retention_pallas(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    log_g: Float[Array, "B T H"] | None,
    initial_state: RetentionState,
    *,
    deg: int,
    scale: float,
    chunk_size: int,
    interpret: bool | None = None,
    block_sizes: BlockSizes | None = None,
    backend: str | None = None,
) -> tuple[Float[Array, "B T Hq d"], RetentionState]:
    """Power retention over T >= 1 tokens from `initial_state` (inputs validated by the op). Returns (y in v's
    dtype, the final RetentionState). `backend` ('gpu' or 'tpu') picks the kernel variant; None means the default
    device's (the GPU variant on CPU, interpreted). `interpret` None means True on CPU."""
    backend = resolve_backend(backend)
    B, T, Hq, d = q.shape
    H = k.shape[2]
    c = chunk_size
    blocks = block_sizes or default_block_sizes(backend, d)
    check_kernel_shapes(deg, d, Hq // H, backend, c)
    if backend == "gpu" and blocks.rows(d)[1] != d:
        raise ValueError(f"BlockSizes.read_rows={blocks.read_rows}: on GPU the read and gradient kernels loop over all "
                         f"d={d} rows in one program (grid programs cannot accumulate into one block); use None")
    N = -(-T // c)
    pad = [(0, 0), (0, N * c - T), (0, 0), (0, 0)]
    q_BHgTd = rearrange(jnp.pad(q, pad), "B T (H g) d -> B H g T d", H=H)
    k_BHTd, v_BHTd = (rearrange(jnp.pad(x, pad), "B T H d -> B H T d") for x in (k, v))
    log_g = jnp.zeros((B, T, H), jnp.float32) if log_g is None else log_g.astype(jnp.float32)
    log_g_BHNc = rearrange(jnp.pad(log_g, pad[:3]), "B (N c) H -> B H N c", c=c)
    G_BHT = rearrange(jnp.cumsum(log_g_BHNc, axis=-1), "B H N c -> B H (N c)")
    settings = Settings(c, float(scale), backend, blocks, matmul_precision(q.dtype), resolve_interpret(interpret))
    y, S_exp, Z = chunked_core(settings, q_BHgTd, k_BHTd, v_BHTd, G_BHT, *to_expanded(initial_state))
    y = rearrange(y[:, :, :T], "B Hq T d -> B T Hq d")
    return y.astype(v.dtype), from_expanded(S_exp, Z)
