"""The gated delta rule (Gated DeltaNet) with the sequence split over a mesh axis (`matrix_state_context_parallel`:
each device's state from empty and its transition, a d_k x d_k matrix per head, an exclusive scan of them over the
axis, each device's outputs finished from the state entering it)."""

from jaxtyping import Array, Float, Int

from retention.ops.context_mesh import SEQUENCE_AXIS
from retention.ops.gated_delta_rule.op import _check_gates, gated_delta_rule
from retention.ops.matrix_state_context_parallel import matrix_state_context_parallel


def gated_delta_rule_context_parallel(
    q: Float[Array, "B T Hq dk"],
    k: Float[Array, "B T H dk"],
    v: Float[Array, "B T H dv"],
    beta: Float[Array, "B T H"],
    log_g: Float[Array, "B T H"] | None = None,
    *,
    segment_ids: Int[Array, "B T"] | None = None,
    scale: float | None = None,
    chunk_size: int | None = None,
    initial_state: Float[Array, "B H dk dv"] | None = None,
    return_state: bool = False,
    mesh=None,
    axis: str = SEQUENCE_AXIS,
    batch_axes: tuple[str, ...] | None = None,
):
    """`gated_delta_rule` with the sequence split over the mesh axis `axis`: the same arguments and result.

    Args:
        q: queries [B, T, Hq, d_k].
        k: keys [B, T, H, d_k].
        v: values [B, T, H, d_v].
        beta: write strengths [B, T, H] in [0, 1].
        log_g: log decays [B, T, H], <= 0, or None.
        segment_ids: int [B, T] or None.
        scale: None is d_k^-0.5.
        chunk_size: the local op's; None: its default for T / n tokens.
        initial_state: S_0 [B, H, d_k, d_v] float32, or None.
        return_state: also return the state after the last token.
        mesh (Mesh | None): the device mesh, or None for the ambient one (`jax.set_mesh`).
        axis: the mesh axis that splits the sequence; T must be a multiple of its size.
        batch_axes: the mesh axes that split the batch (None: every other axis but "tensor"). A "tensor" axis
            splits the heads; its size must divide Hq and H.

    Returns:
        (Array | tuple[Array, Array]): o [B, T, Hq, d_v] in v's dtype, or the pair (o, state [B, H, d_k, d_v]).
    """
    return matrix_state_context_parallel(
        gated_delta_rule,
        _check_gates,
        "matrix",
        q,
        k,
        v,
        (beta, log_g),
        segment_ids=segment_ids,
        scale=scale,
        chunk_size=chunk_size,
        initial_state=initial_state,
        return_state=return_state,
        mesh=mesh,
        axis=axis,
        batch_axes=batch_axes,
    )
