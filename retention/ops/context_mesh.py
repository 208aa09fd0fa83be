"""The mesh helpers of the context-parallel ops (each sequence's tokens split over the mesh axis "sequence"): the
axis, its size in the ambient mesh, and resolving (mesh, axis, batch axes) for a call."""

import math

import jax

SEQUENCE_AXIS = "sequence"
TENSOR_AXIS = "tensor"  # tensor parallelism splits heads, never rows: not a default batch axis


def context_parallel_size(axis: str = SEQUENCE_AXIS) -> int:
    """The size of `axis` in the ambient mesh (set by `jax.set_mesh`), 1 without a mesh or without that axis."""
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
