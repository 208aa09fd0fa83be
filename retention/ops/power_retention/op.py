"""The public power-retention ops and their dispatch: the full op and the step from a state.

impl = "auto" | "xla" | "pallas" | "reference":
- "xla": the chunked form in plain JAX (`chunked.py`), on every backend; a step of n tokens up to the chunk size
  runs as one chunk against the state (`recurrent.chunk_step`);
- "reference": the quadratic oracle (`reference.py`), O(T^2) memory, no state in or out (so no step);
- "pallas": the Pallas kernels (`pallas.py`), interpreted on CPU; raises NotImplementedError or ValueError for
  what they do not support (degree 2 only; on GPU powers of two). Under a mesh they run in a shard_map over its
  batch and head axes (`pallas_mesh.py`); their chunk size, when none is given, is the kernels' (BlockSizes);
- "auto": the Pallas kernels on GPU and TPU where they support the shapes and dtype, else the XLA path.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from retention.ops.power_retention.chunked import power_retention_chunked
from retention.ops.power_retention.pallas import pallas_supports
from retention.ops.power_retention.pallas_mesh import chunked_on_mesh, step_on_mesh
from retention.ops.power_retention.recurrent import chunk_step
from retention.ops.power_retention.reference import power_retention_reference
from retention.ops.power_retention.state import RetentionState, check_state, init_state
from retention.ops.power_retention.validation import (
    DEFAULT_CHUNK_SIZE,
    RETENTION_IMPLS,
    STATE_IMPLS,
    check_chunk_size,
    check_deg,
    check_log_g,
    default_chunk_size,
)
from retention.ops.validation import check_qkv, check_scale
from retention.validation import check_choice


def _check_args(q, k, v, log_g, deg, scale, chunk_size, impl, impls) -> float:
    """The checks both ops share; returns the resolved scale (1/sqrt(d) for None)."""
    check_qkv(q, k, v)
    check_deg(deg)
    check_log_g(log_g, k)
    check_scale(scale)
    check_chunk_size(chunk_size)
    check_choice("impl", impl, impls)
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def _use_pallas(impl: str, q, k, deg: int, chunk_size: int | None) -> bool:
    """Whether `impl` runs the Pallas kernels: always for "pallas"; for "auto" on GPU or TPU when they support
    the degree, shapes and dtype."""
    if impl == "pallas":
        return True
    if impl != "auto" or jax.default_backend() not in ("gpu", "tpu") or q.dtype not in (jnp.float32, jnp.bfloat16):
        return False
    return pallas_supports(deg, q.shape[-1], q.shape[2] // k.shape[2], chunk_size)


def power_retention(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    log_g: Float[Array, "B T H"] | None = None,
    *,
    deg: int = 2,
    scale: float | None = None,
    chunk_size: int | None = None,
    initial_state: RetentionState | None = None,
    return_state: bool = False,
    impl: str = "auto",
):
    """Causal power retention: y_i = sum_{j<=i} w_ij v_j / sum_j w_ij, w_ij = (scale q_i.k_j)^deg exp(G_i - G_j).

    q is [B, T, Hq, d], k and v [B, T, H, d] (query head i reads kv-head i // (Hq // H)), log_g [B, T, H] (<= 0)
    or None. Returns y [B, T, Hq, d] in v's dtype, or (y, state) with `return_state`, state = RetentionState with
    S [B, H, D, d] and z [B, H, D], D = C(d + deg - 1, deg), float32. chunk_size: one of CHUNK_SIZES, or None for
    `default_chunk_size(T)`.
    """
    scale = _check_args(q, k, v, log_g, deg, scale, chunk_size, impl, RETENTION_IMPLS)
    B, T, _, d = q.shape
    H = k.shape[2]
    if initial_state is not None:
        check_state(initial_state, B, H, d, deg, "initial_state")
    if impl == "reference":
        if initial_state is not None or return_state:
            raise ValueError("impl='reference' takes no initial_state and returns no state; use impl='xla'")
        return power_retention_reference(q, k, v, log_g, deg=deg, scale=scale)

    if _use_pallas(impl, q, k, deg, chunk_size):
        state = init_state(B, H, d, deg) if initial_state is None else initial_state
        y, state = chunked_on_mesh(q, k, v, log_g, state, deg=deg, scale=scale, chunk_size=chunk_size)
    else:  # None: an empty state, which the chunked path need not read
        chunk_size = chunk_size or default_chunk_size(T)
        y, state = power_retention_chunked(q, k, v, log_g, initial_state, deg=deg, scale=scale, chunk_size=chunk_size)
    return (y, state) if return_state else y


def power_retention_step(
    state: RetentionState,
    q: Float[Array, "B n Hq d"],
    k: Float[Array, "B n H d"],
    v: Float[Array, "B n H d"],
    log_g: Float[Array, "B n H"] | None = None,
    *,
    deg: int = 2,
    scale: float | None = None,
    chunk_size: int | None = None,
    impl: str = "auto",
) -> tuple[Float[Array, "B n Hq d"], RetentionState]:
    """n >= 1 new tokens continuing `state`: row i of y equals row t0 + i of the full forward. Returns (y in v's
    dtype, the updated state).

    Up to `chunk_size` tokens (None: DEFAULT_CHUNK_SIZE) form one chunk against the state, so each row gets its
    own gate discount (the state and earlier new keys are decayed by the gates up to that row, not by all n);
    inside a compiled loop the state is updated in place. More tokens (a prompt) run the chunked op from the
    state, in chunks of `chunk_size` (None: `default_chunk_size(n)`). impl: "auto" (the Pallas kernels on GPU and
    TPU where they support the shapes, else XLA), "xla" or "pallas" (interpreted on CPU): one of STATE_IMPLS.
    """
    scale = _check_args(q, k, v, log_g, deg, scale, chunk_size, impl, STATE_IMPLS)
    B, n, _, d = q.shape
    check_state(state, B, k.shape[2], d, deg, "state")
    if n > (chunk_size or DEFAULT_CHUNK_SIZE):
        return power_retention(
            q,
            k,
            v,
            log_g,
            deg=deg,
            scale=scale,
            chunk_size=chunk_size,
            initial_state=state,
            return_state=True,
            impl=impl,
        )
    run = step_on_mesh if _use_pallas(impl, q, k, deg, None) else chunk_step
    return run(state, q, k, v, log_g, deg=deg, scale=scale)
