"""The fixed-size memory of power retention: S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j), decayed by the gates."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from retention.ops.power_retention.sympow import sympow_dim
from retention.ops.power_retention.validation import check_deg
from retention.validation import check_int


class RetentionState(NamedTuple):
    """The state per batch row and kv-head, float32; D = C(d + deg - 1, deg).

    Attributes:
        S: sum_j phi(k_j) v_j^T, decayed by the gates: [B, H, D, d].
        z: sum_j phi(k_j), the normaliser, decayed alike: [B, H, D].
    """

    S: Float[Array, "B H D d"]
    z: Float[Array, "B H D"]


def init_state(batch: int, heads: int, head_dim: int, deg: int = 2) -> RetentionState:
    """An empty state: zeros, float32.

    Args:
        batch: rows B.
        heads: kv-heads H.
        head_dim: d.
        deg: the even degree p >= 2.

    Returns:
        S [batch, heads, D, head_dim] and z [batch, heads, D], D = C(head_dim + deg - 1, deg).
    """
    for name, value in (("batch", batch), ("heads", heads), ("head_dim", head_dim)):
        check_int(name, value)
    check_deg(deg)
    D = sympow_dim(head_dim, deg)
    return RetentionState(
        S=jnp.zeros((batch, heads, D, head_dim), jnp.float32), z=jnp.zeros((batch, heads, D), jnp.float32)
    )


def check_state(state, B: int, H: int, d: int, deg: int, name: str) -> None:
    """`state` (the argument `name`) is a RetentionState with float32 S [B, H, D, d] and z [B, H, D] for degree
    `deg`."""
    D = sympow_dim(d, deg)
    if not isinstance(state, RetentionState):
        raise TypeError(f"{name} must be a RetentionState(S, z) (see init_state), got {type(state).__name__}")
    if state.S.dtype != jnp.float32 or state.z.dtype != jnp.float32:
        dtypes = f"S {state.S.dtype} and z {state.z.dtype}"
        raise TypeError(f"{name} must hold float32 S and z (see init_state), got {dtypes}")
    if state.S.shape != (B, H, D, d) or state.z.shape != (B, H, D):
        raise ValueError(
            f"{name} must have S [B, H, D, d] = {(B, H, D, d)} and z [B, H, D] = {(B, H, D)} for deg={deg}, "
            f"got S {state.S.shape} and z {state.z.shape}"
        )


def clear_rows(state: RetentionState, rows_B) -> RetentionState:
    """The state with the batch rows where rows_B [B] is true emptied (a `where`: a NaN in a cleared row goes too)."""
    return jax.tree.map(lambda x: jnp.where(rows_B.reshape((-1,) + (1,) * (x.ndim - 1)), 0.0, x), state)


def with_ones(v: Float[Array, "*b e"]) -> Float[Array, "*b e1"]:
    """[v | 1]: the values with a column of ones appended, so one pass writes or reads S and z together."""
    return jnp.concatenate([v, jnp.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)


def augment(state: RetentionState) -> Float[Array, "B H D e"]:
    """S with z appended as its last column: [B, H, D, d+1], so one matmul reads numerator and normaliser."""
    return jnp.concatenate([state.S, state.z[..., None]], axis=-1)


def split(S_aug: Float[Array, "B H D e"]) -> RetentionState:
    """Inverse of `augment`."""
    return RetentionState(S=S_aug[..., :-1], z=S_aug[..., -1])
