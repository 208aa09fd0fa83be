"""The public power-retention ops and their dispatch: the full op and the step from a state.

impl = "auto" | "xla" | "pallas" | "reference":
- "xla": the chunked form in plain JAX (`chunked.py`), on every backend; a step of n tokens up to the chunk size
  runs as one chunk against the state (`recurrent.chunk_step`);
- "reference": the quadratic oracle (`reference.py`), O(T^2) memory, no state in or out (so no step);
- "pallas": the Pallas kernels (`pallas.py`), interpreted on CPU; raises NotImplementedError or ValueError for
  what they do not support (degree 2 only; on GPU powers of two). Under a mesh they run in a shard_map over its
  batch and head axes (`pallas_mesh.py`); their chunk size, when none is given, is the kernels' (BlockSizes);
- "auto": the Pallas kernels on TPU where they support the shapes and dtype, else the XLA path, on GPU too: on the
  first real GPU run (one H200, jax 0.11.2, 2026-12-04, experiments/PERF_LOG.md) the Triton kernels did not
  compile for bf16 inputs (a boolean moved through shared memory) nor for float32 at chunk 128 (shared memory),
  so on a GPU they run only when asked for ("pallas") until a device run shows them compiling and matching.
Resets: `segment_ids` and -inf gates clear the state exactly (`gates.py`, on every path, the kernels included);
non-finite inputs give NaN in the rows that see them, never zeros; `debug_checks=True` raises on them instead (a
host callback, also under jit).
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from retention.ops.chunking import DEFAULT_CHUNK_SIZE, default_chunk_size
from retention.ops.platform import target_platform
from retention.ops.power_retention.chunked import power_retention_chunked
from retention.ops.power_retention.pallas import pallas_supports
from retention.ops.power_retention.pallas_mesh import chunked_on_mesh, step_on_mesh
from retention.ops.power_retention.recurrent import chunk_step
from retention.ops.power_retention.reference import power_retention_reference
from retention.ops.power_retention.state import RetentionState, check_state, clear_rows, init_state
from retention.ops.power_retention.validation import RETENTION_IMPLS, STATE_IMPLS, check_op_args, runtime_gate_checks
from retention.ops.validation import runtime_input_checks
from retention.validation import check_at_runtime

STEP_PIECE = 16384  # tokens per chunked call inside a long step: a piece's temporaries, whatever n is


def run_debug_checks(q, k, v, log_g, segment_ids, state, state_name: str) -> None:
    """debug_checks=True: non-finite q, k, v or state, positive or NaN gates, non-contiguous documents raise."""
    arrays = {"q": q, "k": k, "v": v}
    if state is not None:
        arrays.update({f"{state_name}.S": state.S, f"{state_name}.z": state.z})
    check_at_runtime(runtime_input_checks(arrays, segment_ids) + runtime_gate_checks(log_g))


def _use_pallas(impl: str, q, k, deg: int, chunk_size: int | None) -> bool:
    """Whether `impl` runs the Pallas kernels: always for "pallas"; for "auto" on TPU when they support the
    degree, shapes and dtype (not on GPU: the module docstring says why)."""
    if impl == "pallas":
        return True
    if impl != "auto" or target_platform() != "tpu" or q.dtype not in (jnp.float32, jnp.bfloat16):
        return False
    return pallas_supports(deg, q.shape[-1], q.shape[2] // k.shape[2], chunk_size)


@jax.named_scope("power_retention")
def power_retention(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    log_g: Float[Array, "B T H"] | None = None,
    *,
    segment_ids: Int[Array, "B T"] | None = None,
    deg: int = 2,
    scale: float | None = None,
    chunk_size: int | None = None,
    initial_state: RetentionState | None = None,
    return_state: bool = False,
    impl: str = "auto",
    debug_checks: bool = False,
):
    """Causal power retention: y_i = sum_{j<=i} w_ij v_j / sum_j w_ij, w_ij = (scale q_i.k_j)^deg exp(G_i - G_j)
    for keys j of i's document, 0 for earlier documents.

    A NaN or inf in q, k or v, or a NaN gate, gives NaN in that row and the later rows of its document.

    Args:
        q: queries [B, T, Hq, d]; query head i reads kv-head i // (Hq // H).
        k: keys [B, T, H, d].
        v: values [B, T, H, d].
        log_g: log gates [B, T, H], <= 0 (-inf is an exact reset), or None for no decay.
        segment_ids: int [B, T]: equal ids form one document, contiguous in time; the state resets where the id
            changes, never at token 0 (an initial state continues into token 0's document). None: one document.
        deg: the even degree p >= 2.
        scale: a finite number > 0 multiplying q.k; None is d^-0.5.
        chunk_size: one of CHUNK_SIZES, or None for `default_chunk_size(T)`.
        initial_state: the state to continue from (None: empty).
        return_state: also return the state after the last token.
        impl: one of RETENTION_IMPLS: "auto" (the Pallas kernels on TPU where they support the shapes, else
            "xla"), "xla" (chunked, plain JAX), "pallas" (interpreted on CPU) or "reference" (the quadratic oracle;
            no state in or out).
        debug_checks: raise ValueError for non-finite inputs, positive or NaN gates and non-contiguous documents,
            also under jit.

    Returns:
        (Array | tuple[Array, RetentionState]): y [B, T, Hq, d] in v's dtype; with `return_state` the pair
            (y, state), state a RetentionState with S [B, H, D, d] and z [B, H, D], D = C(d + deg - 1, deg), float32.

    Raises:
        ValueError: a bad shape, degree, chunk size, scale or impl, naming the argument.
        TypeError: a bad dtype, or an initial state of another type, shape or dtype.
    """
    scale = check_op_args(q, k, v, log_g, segment_ids, deg, scale, chunk_size, impl, RETENTION_IMPLS)
    B, T, _, d = q.shape
    H = k.shape[2]
    if initial_state is not None:
        check_state(initial_state, B, H, d, deg, "initial_state")
    if debug_checks:
        run_debug_checks(q, k, v, log_g, segment_ids, initial_state, "initial_state")
    if impl == "reference":
        if initial_state is not None or return_state:
            raise ValueError("impl='reference' takes no initial_state and returns no state; use impl='xla'")
        return power_retention_reference(q, k, v, log_g, segment_ids=segment_ids, deg=deg, scale=scale)

    if _use_pallas(impl, q, k, deg, chunk_size):
        state = init_state(B, H, d, deg) if initial_state is None else initial_state
        y, state = chunked_on_mesh(
            q, k, v, log_g, state, segment_ids=segment_ids, deg=deg, scale=scale, chunk_size=chunk_size
        )
    else:  # None: an empty state, which the chunked path need not read
        chunk_size = chunk_size or default_chunk_size(T)
        y, state = power_retention_chunked(
            q, k, v, log_g, initial_state, segment_ids=segment_ids, deg=deg, scale=scale, chunk_size=chunk_size
        )
    return (y, state) if return_state else y


@jax.named_scope("power_retention_step")
def power_retention_step(
    state: RetentionState,
    q: Float[Array, "B n Hq d"],
    k: Float[Array, "B n H d"],
    v: Float[Array, "B n H d"],
    log_g: Float[Array, "B n H"] | None = None,
    *,
    segment_ids: Int[Array, "B n"] | None = None,
    deg: int = 2,
    scale: float | None = None,
    chunk_size: int | None = None,
    impl: str = "auto",
    debug_checks: bool = False,
) -> tuple[Float[Array, "B n Hq d"], RetentionState]:
    """n >= 1 new tokens continuing `state`: row i of y equals row t0 + i of the full forward.

    Up to `chunk_size` tokens (None: DEFAULT_CHUNK_SIZE) form one chunk against the state, so each row gets its
    own gate discount (the state and earlier new keys are decayed by the gates up to that row, not by all n);
    inside a compiled loop the state is updated in place. More tokens (a prompt) run the chunked op from the
    state, in chunks of `chunk_size` (None: `default_chunk_size(n)`), STEP_PIECE tokens at a time so that its
    temporaries stay those of one piece (memory linear in n: the output, plus a constant).

    Args:
        state: the state after the t0 tokens before these (`init_state` for none).
        q: queries [B, n, Hq, d].
        k: keys [B, n, H, d].
        v: values [B, n, H, d].
        log_g: log gates [B, n, H], <= 0, or None.
        segment_ids: int [B, n]: resets the state where the id changes inside the step; token 0 continues the
            state's document. To start a new one there, pass log_g = -inf at token 0 or an empty state (the
            PowerRetention mixer records each row's last segment id and clears the state of the rows that start one).
        deg: the even degree p >= 2, the state's.
        scale: as in `power_retention`.
        chunk_size: as above.
        impl: one of STATE_IMPLS: "auto" (the Pallas kernels on TPU where they support the shapes, else
            XLA), "xla" or "pallas" (interpreted on CPU).
        debug_checks: as in `power_retention` (state, q, k, v finite).

    Returns:
        y: [B, n, Hq, d] in v's dtype.
        state: the updated state.
    """
    scale = check_op_args(q, k, v, log_g, segment_ids, deg, scale, chunk_size, impl, STATE_IMPLS)
    B, n, _, d = q.shape
    check_state(state, B, k.shape[2], d, deg, "state")
    if debug_checks:
        run_debug_checks(q, k, v, log_g, segment_ids, state, "state")
    if n > (chunk_size or DEFAULT_CHUNK_SIZE):
        return _chunked_in_pieces(
            state, q, k, v, log_g, segment_ids=segment_ids, deg=deg, scale=scale, chunk_size=chunk_size, impl=impl
        )
    run = step_on_mesh if _use_pallas(impl, q, k, deg, None) else chunk_step
    return run(state, q, k, v, log_g, segment_ids=segment_ids, deg=deg, scale=scale)


def _chunked_in_pieces(state, q, k, v, log_g, *, segment_ids, deg, scale, chunk_size, impl):
    """The chunked op from `state` over n tokens, STEP_PIECE at a time in a loop (the last, shorter piece after
    it), each from the state the one before left (cleared for the rows whose piece starts a document): (y, state).
    Pieces are whole chunks, so the arithmetic is the one-call op's."""
    n = q.shape[1]

    def run(state, start, size):
        piece = lambda x: None if x is None else jax.lax.dynamic_slice_in_dim(x, start, size, axis=1)
        if segment_ids is not None:  # a piece's first token may start a document (a call's token 0 never resets)
            previous = jax.lax.dynamic_index_in_dim(segment_ids, jnp.maximum(start - 1, 0), axis=1, keepdims=False)
            state = clear_rows(state, (start > 0) & (piece(segment_ids)[:, 0] != previous))
        args = map(piece, (q, k, v, log_g))
        return power_retention(
            *args,
            segment_ids=piece(segment_ids),
            deg=deg,
            scale=scale,
            chunk_size=chunk_size,
            impl=impl,
            initial_state=state,
            return_state=True,
        )

    full = n // STEP_PIECE
    if full == 0 or n == STEP_PIECE:
        return run(state, 0, n)

    def body(i, carry):
        y, state = carry
        y_i, state = run(state, i * STEP_PIECE, STEP_PIECE)
        return jax.lax.dynamic_update_slice_in_dim(y, y_i, i * STEP_PIECE, axis=1), state

    y = jnp.zeros(q.shape, v.dtype)
    y, state = jax.lax.fori_loop(0, full, body, (y, state))
    if n > full * STEP_PIECE:
        y_rest, state = run(state, full * STEP_PIECE, n - full * STEP_PIECE)
        y = jax.lax.dynamic_update_slice_in_dim(y, y_rest, full * STEP_PIECE, axis=1)
    return y, state
