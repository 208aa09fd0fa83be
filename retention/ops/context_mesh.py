"""The mesh helpers of the context-parallel ops (each sequence's tokens split over the mesh axis "sequence"): the
axis, its size in the ambient mesh, resolving (mesh, axis, batch axes) for a call, and the mesh axis that splits
the heads inside the ops' shard_map ("tensor": tensor parallelism, whole heads per device)."""

import math

import jax

SEQUENCE_AXIS = "sequence"
TENSOR_AXIS = "tensor"  # tensor parallelism splits heads, never rows: not a default batch axis


def context_parallel_size(axis: str = SEQUENCE_AXIS) -> int:
    """The size of a mesh axis in the ambient mesh (set by `jax.set_mesh`).

    Args:
        axis: the mesh axis.

    Returns:
        Its size; 1 without a mesh or without that axis.
    """
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty or axis not in mesh.axis_names else mesh.shape[axis]


def resolve_sequence_mesh(mesh, axis: str, batch_axes, B: int, T: int):
    """(mesh, n = the size of `axis`, the batch axes as a PartitionSpec entry) after checking the mesh (None: the
    ambient one), the axis and that n divides T and the batch axes (None: every other axis but "tensor") divide B."""
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    if mesh.empty:
        raise ValueError("mesh must be a jax.sharding.Mesh, or the call must run under jax.set_mesh(mesh); got none")
    if axis not in mesh.axis_names:
        raise ValueError(f"axis must name a mesh axis, one of {tuple(mesh.axis_names)}, got {axis!r}")
    n = mesh.shape[axis]
    if T % n:
        raise ValueError(
            f"the sequence length (q.shape[1]) must be a multiple of the mesh axis {axis!r} of size {n}, got T={T}"
        )
    if batch_axes is None:
        batch_axes = tuple(a for a in mesh.axis_names if a not in (axis, TENSOR_AXIS))
    batch_axes = tuple(batch_axes)
    if axis in batch_axes or set(batch_axes) - set(mesh.axis_names):
        raise ValueError(f"batch_axes must name mesh axes other than {axis!r}, got {batch_axes}")
    rows = math.prod(mesh.shape[a] for a in batch_axes)
    if B % rows:
        raise ValueError(
            f"the batch (q.shape[0]) must be a multiple of the mesh axes {batch_axes} of size {rows}, got B={B}"
        )
    return mesh, n, (batch_axes or None)


def heads_axis(mesh, axis: str, rows, heads: dict[str, int]) -> str | None:
    """The mesh axis that splits the heads dims inside a context-parallel op's shard_map: "tensor" when the mesh has
    it with more than one device and the tokens' dims do not use it already (as the sequence `axis` or among
    `resolve_sequence_mesh`'s batch axes `rows`), else None (every device holds all heads). Over "tensor" of size t
    each device holds a contiguous block of 1/t of every heads dim, so GQA's query head i -> kv-head i // (Hq / H)
    stays on one device and a flat head-major channel dim (heads * head_dim) splits into whole heads.
    `heads`: {argument: its size}, e.g. {"q.shape[2] (query heads)": Hq}; ValueError naming the argument when t
    does not divide it."""
    if TENSOR_AXIS not in mesh.axis_names or TENSOR_AXIS in (axis, *(rows or ())) or mesh.shape[TENSOR_AXIS] == 1:
        return None
    t = mesh.shape[TENSOR_AXIS]
    for name, count in heads.items():
        if count % t:
            raise ValueError(
                f"{name} must be a multiple of the mesh axis {TENSOR_AXIS!r} of size {t}, which splits whole heads "
                f"over its devices, got {count}"
            )
    return TENSOR_AXIS
