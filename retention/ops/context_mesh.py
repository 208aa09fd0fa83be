"""The mesh helpers of the context-parallel ops (each sequence's tokens split over the mesh axis "sequence"): the
axis, its size in the ambient mesh, resolving (mesh, axis, batch axes) for a call, the mesh axis that splits the
heads inside the ops' shard_map ("tensor": tensor parallelism, whole heads per device), the exclusive scan of the
devices' segments over the axis (`exclusive_scan`) and a constant cast to vary like the shard's values
(`vary_like`)."""

import math

import jax
import jax.numpy as jnp

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


def exclusive_scan(elems, combine, axis: str, n: int, identity=None):
    """The exclusive prefix over the devices of `axis` of an associative `combine`, inside a shard_map: device i
    gets combine(...combine(e_0, e_1)..., e_{i-1}) of the devices' `elems`, device 0 the identity. One shift by a
    device, then Hillis-Steele rounds (shift 1, 2, 4, ...: after the round with shift s, device i covers the
    segments i-2s .. i-1), all by `ppermute`: 1 + ceil(log2 n) rounds of one element each per device (an
    all_gather would move n - 1).

    Args:
        elems: this device's element, a pytree of arrays.
        combine: (earlier, later) -> their composite, the segment `earlier` followed by `later`.
        axis: the mesh axis.
        n: its size.
        identity: the operator's identity, a pytree like elems whose leaves broadcast against them, given to the
            devices that receive nothing; None: zeros (what `ppermute` gives them), when zeros are the identity.

    Returns:
        The exclusive prefix, a pytree like elems.
    """
    index = jax.lax.axis_index(axis)

    def shift(x, s):
        moved = jax.tree.map(lambda a: jax.lax.ppermute(a, axis, [(i, i + s) for i in range(n - s)]), x)
        if identity is None:
            return moved
        return jax.tree.map(lambda a, e: jnp.where(index >= s, a, e), moved, identity)

    prefix, s = shift(elems, 1), 1
    while s < n:
        prefix = combine(shift(prefix, s), prefix)
        s *= 2
    return prefix


def vary_like(x, like):
    """x cast to vary over the mesh axes `like` varies over (inside a shard_map with check_vma: a constant that
    starts a scan's carry must, as the carry it becomes does); the transpose sums the cotangent back."""
    missing = tuple(sorted(jax.typeof(like).manual_axis_type.varying - jax.typeof(x).manual_axis_type.varying))
    return jax.lax.pcast(x, missing, to="varying") if missing else x
