"""The public power-retention op and its dispatch, and the decode step.

impl = "auto" | "xla" | "pallas" | "reference":
- "xla": the chunked form in plain JAX (`chunked.py`), on every backend;
- "reference": the quadratic oracle (`reference.py`), O(T^2) memory, no state in or out;
- "pallas": the Pallas kernels (`pallas_kernels/power_retention`), interpreted on CPU; raises
  NotImplementedError or ValueError for what they do not support (degree 2 only; on GPU powers of two);
- "auto": the Pallas kernels on GPU and TPU where they support the shapes and dtype, else the XLA path.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

# Module imports, read at call time: the kernels import retention's state type, so either package may load first.
import pallas_kernels.power_retention.decode as pallas_decode
import pallas_kernels.power_retention.forward as pallas_forward
from retention.ops.chunked import power_retention_chunked
from retention.ops.recurrent import RetentionState, chunk_step, init_state
from retention.ops.reference import power_retention_reference
from retention.ops.sympow import sympow_dim
from retention.ops.validation import check_deg, check_log_g, check_qkv, check_scale

IMPLS = ("auto", "xla", "pallas", "reference")
CHUNK_SIZES = (16, 32, 64, 128, 256, 512, 1024)
DEFAULT_CHUNK_SIZE = 128  # fastest measured on CPU at d=64 (experiments/PERF_LOG.md)


def default_chunk_size(T: int) -> int:
    """128, or the smallest allowed chunk that holds all of a shorter sequence."""
    return next((c for c in CHUNK_SIZES if c >= min(T, DEFAULT_CHUNK_SIZE)), DEFAULT_CHUNK_SIZE)


def _use_pallas(impl: str, q, k, deg: int, chunk_size: int | None) -> bool:
    """Whether `impl` runs the Pallas kernels: always for "pallas"; for "auto" on GPU or TPU when they support
    the degree, shapes and dtype."""
    if impl == "pallas":
        return True
    if impl != "auto" or jax.default_backend() not in ("gpu", "tpu") or q.dtype not in (jnp.float32, jnp.bfloat16):
        return False
    try:
        pallas_forward.check_kernel_shapes(deg, q.shape[-1], q.shape[2] // k.shape[2], jax.default_backend(), chunk_size)
    except (NotImplementedError, ValueError):
        return False
    return True


def _check_state(state, B: int, H: int, d: int, deg: int, name: str) -> None:
    D = sympow_dim(d, deg)
    if not isinstance(state, RetentionState):
        raise TypeError(f"{name} must be a RetentionState(S, z) (see init_state), got {type(state).__name__}")
    if state.S.shape != (B, H, D, d) or state.z.shape != (B, H, D):
        raise ValueError(
            f"{name} must have S [B, H, D, d] = {(B, H, D, d)} and z [B, H, D] = {(B, H, D)} for deg={deg}, "
            f"got S {state.S.shape} and z {state.z.shape}"
        )


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
    S [B, H, D, d] and z [B, H, D], D = C(d + deg - 1, deg), float32.
    """
    check_qkv(q, k, v)
    check_deg(deg)
    check_log_g(log_g, k)
    check_scale(scale)
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    B, T, _, d = q.shape
    H = k.shape[2]
    if chunk_size is not None and (isinstance(chunk_size, bool) or chunk_size not in CHUNK_SIZES):
        raise ValueError(f"chunk_size must be None or one of {CHUNK_SIZES}, got {chunk_size!r}")
    if initial_state is not None:
        _check_state(initial_state, B, H, d, deg, "initial_state")
    scale = d**-0.5 if scale is None else float(scale)

    if impl == "reference":
        if initial_state is not None or return_state:
            raise ValueError("impl='reference' takes no initial_state and returns no state; use impl='xla'")
        return power_retention_reference(q, k, v, log_g, deg=deg, scale=scale)

    chunk_size = chunk_size or default_chunk_size(T)
    if _use_pallas(impl, q, k, deg, chunk_size):
        state = init_state(B, H, d, deg) if initial_state is None else initial_state
        y, state = pallas_forward.power_retention_pallas(q, k, v, log_g, state, deg=deg, scale=scale,
                                                         chunk_size=chunk_size)
    else:  # None: an empty state, which the chunked path need not read
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
    impl: str = "auto",
) -> tuple[Float[Array, "B n Hq d"], RetentionState]:
    """Decode n >= 1 new tokens against `state`: row i of y equals row t0 + i of the full forward.

    The n tokens form one chunk, so each row gets its own gate discount (the state and earlier new keys are
    decayed by the gates up to that row, not by all n). Returns (y in v's dtype, the updated state).
    Inside a compiled loop the state is updated in place. impl: "auto" (the Pallas decode kernel on GPU and TPU
    where it supports the shapes, else XLA), "xla" or "pallas" (interpreted on CPU).
    """
    check_qkv(q, k, v)
    check_deg(deg)
    check_log_g(log_g, k)
    check_scale(scale)
    B, n, _, d = q.shape
    _check_state(state, B, k.shape[2], d, deg, "state")
    if impl not in ("auto", "xla", "pallas"):
        raise ValueError(f"impl must be one of ('auto', 'xla', 'pallas') for a decode step, got {impl!r}")
    scale = d**-0.5 if scale is None else float(scale)
    run = pallas_decode.power_retention_step_pallas if _use_pallas(impl, q, k, deg, None) else chunk_step
    return run(state, q, k, v, log_g, deg=deg, scale=scale)


