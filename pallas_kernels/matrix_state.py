"""What the matrix-state kernels (gated linear attention, the gated delta rule) share: the shapes they support, and
rows of a value read and written by masked sums (no value slicing: Triton has none; a traced index works)."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

SUB_CHUNK = 16  # tokens per sub-chunk, and the smallest chunk: the smallest Triton matmul side


def check_supported(d_k: int, d_v: int, g: int, chunk: int, backend: str) -> None:
    """Raise ValueError, naming the value, for what the matrix-state kernels (GLA, the gated delta rule) of `backend`
    do not support: the chunk must be a multiple of SUB_CHUNK (16) on both backends; on GPU (Triton) it, d_k and d_v
    must be powers of two >= 16 and the query heads per kv-head g a power of two.

    Args:
        d_k: the key dim.
        d_v: the value dim.
        g: query heads per kv-head.
        chunk: tokens per chunk.
        backend: "gpu" or "tpu".
    """
    if chunk % SUB_CHUNK:
        raise ValueError(f"chunk_size={chunk}: the matrix-state kernels need a multiple of {SUB_CHUNK}")
    if backend != "gpu":
        return
    pow2 = lambda n: n >= 1 and n & (n - 1) == 0
    for name, value in (("chunk_size", chunk), ("d_k", d_k), ("d_v", d_v)):
        if not (pow2(value) and value >= 16):
            raise ValueError(f"{name}={value}: the Triton kernels need a power of two >= 16")
    if not pow2(g):
        raise ValueError(f"query heads per kv-head {g}: the Triton kernels need a power of two")


def row(x: Float[Array, "s n"], j) -> Float[Array, "1 n"]:
    """Row j of x (j static or traced) as [1, n], by a masked sum over the rows.

    Args:
        x: a [s, n] value.
        j: the row index.

    Returns:
        x[j] as [1, n].
    """
    rows = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
    return jnp.sum(jnp.where(rows == j, x, 0.0), axis=0, keepdims=True)


def put_row(x_row: Float[Array, "1 n"], j, s: int) -> Float[Array, "s n"]:
    """A value that is x_row in row j and 0 elsewhere.

    Args:
        x_row: the row [1, n].
        j: its index (static or traced).
        s: the rows of the result.

    Returns:
        [s, n].
    """
    rows = jax.lax.broadcasted_iota(jnp.int32, (s, x_row.shape[1]), 0)
    return jnp.where(rows == j, x_row, 0.0)
