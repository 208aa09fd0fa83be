"""The public chunked entry point of the GLA kernels: check, pad, lay out head-major, run the kernels under their VJP
(vjp.py), crop."""

import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Float

from pallas_kernels.gated_linear_attention.vjp import Settings, gla_core
from pallas_kernels.matrix_state import SUB_CHUNK, check_supported
from pallas_kernels.power_retention.config import BlockSizes, matmul_for, resolve_backend, resolve_interpret
from pallas_kernels.vma import same_varying


def chunked_gla(
    q: Float[Array, "B T Hq dk"],
    k: Float[Array, "B T H dk"],
    v: Float[Array, "B T H dv"],
    F: Float[Array, "B T H dk"],
    R: Float[Array, "B T H"],
    f_q: Float[Array, "B T H dk"],
    f_k: Float[Array, "B T H dk"],
    gamma: Float[Array, "B N H dk"],
    S0: Float[Array, "B H dk dv"],
    *,
    scale: float,
    chunk_size: int,
    interpret: bool | None = None,
    backend: str | None = None,
    block_sizes: BlockSizes | None = None,
) -> tuple[Float[Array, "B T Hq dv"], Float[Array, "B H dk dv"]]:
    """Gated linear attention over T >= 1 tokens from S0, in chunks of `chunk_size`, differentiable in every input
    but R (the package docstring gives the gates' meaning).

    Args:
        q: queries [B, T, Hq, d_k]; query head i reads kv-head i // (Hq // H).
        k: keys [B, T, H, d_k] (finite: the caller zeroes bad tokens).
        v: values [B, T, H, d_v] (finite, likewise).
        F: the cumulative log-gates per chunk and key channel [B, T, H, d_k], finite and non-increasing in a chunk.
        R: the reset counts per chunk [B, T, H] (any float or int dtype).
        f_q: the queries' factors on the carried state, exp(F) where R == 0, else 0 [B, T, H, d_k].
        f_k: the keys' factors into the state carried out, exp(F_end - F) where R == R_end, else 0 [B, T, H, d_k].
        gamma: each chunk's decay of the carried state, exp(F_end) where R_end == 0, else 0 [B, N, H, d_k],
            N = ceil(T / chunk_size).
        S0: the initial state [B, H, d_k, d_v] float32.
        scale: multiplies q.
        chunk_size: tokens per chunk (F, R, f_q, f_k and gamma are per chunk of this size; the last partial chunk's
            padding continues F and R and has zero factors).
        interpret: run in interpret mode; None: on a CPU.
        backend: "gpu" or "tpu" kernels; None: the default device's (GPU's on a CPU).
        block_sizes: Triton's warps and stages (its other fields are not read); None: the defaults.

    Returns:
        (o [B, T, Hq, d_v] in v's dtype, the final state [B, H, d_k, d_v] float32).
    """
    backend = resolve_backend(backend)
    B, T, Hq, d_k = q.shape
    H, d_v, c = k.shape[2], v.shape[-1], chunk_size
    check_supported(d_k, d_v, Hq // H, c, backend)
    q, k, v, F, R, f_q, f_k, gamma, S0 = same_varying(q, k, v, F, R, f_q, f_k, gamma, S0)
    N = -(-T // c)
    pad = lambda x, mode="constant": jnp.pad(x, [(0, 0), (0, N * c - T)] + [(0, 0)] * (x.ndim - 2), mode=mode)
    head_major = lambda x: rearrange(x, "B T H d -> B H T d")
    q_BHgTd = rearrange(pad(q).astype(jnp.float32) * scale, "B T (H g) d -> B H g T d", H=H)
    k_BHTd, v_BHTd, fk_BHTd = (head_major(pad(x)) for x in (k, v, f_k.astype(jnp.float32)))
    F_BHTd = head_major(pad(F.astype(jnp.float32), "edge"))
    R_BHT = rearrange(pad(R.astype(jnp.float32), "edge"), "B T H -> B H T")
    q_gated = q_BHgTd * head_major(pad(f_q.astype(jnp.float32)))[:, :, None]
    k_gated = k_BHTd.astype(jnp.float32) * fk_BHTd
    gamma_BHNd1 = rearrange(gamma.astype(jnp.float32), "B N H d -> B H N d 1")
    settings = Settings(
        c, SUB_CHUNK, backend, block_sizes or BlockSizes(None, None), matmul_for(q.dtype), resolve_interpret(interpret)
    )
    o, S = gla_core(settings, q_BHgTd, k_BHTd, v_BHTd, F_BHTd, R_BHT, q_gated, k_gated, gamma_BHNd1, S0)
    o = rearrange(o, "B H g T e -> B T (H g) e")[:, :T]
    return o.astype(v.dtype), S
