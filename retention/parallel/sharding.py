"""Sharding rules: FSDP for parameters and optimizer state, data (and sequence) parallelism for batches.

All of it is `jax.sharding.NamedSharding` over the mesh of `mesh.py`; XLA's sharding propagation inserts the
collectives (all-gather of a weight before its matmul, reduce-scatter of its gradient), so the model and the
step are the same code on one device and on many.
"""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from retention.parallel.mesh import BATCH_AXES


def fsdp_spec(shape: tuple[int, ...], fsdp_size: int) -> P:
    """P with "fsdp" on the largest axis of `shape` that `fsdp_size` divides (the first of equal ones), or P()
    (replicated) when no axis is divisible or fsdp_size is 1."""
    if fsdp_size == 1:
        return P()
    candidates = [i for i, n in enumerate(shape) if n % fsdp_size == 0]
    if not candidates:
        return P()
    axis = max(candidates, key=lambda i: (shape[i], -i))
    return P(*(("fsdp" if i == axis else None) for i in range(len(shape))))


def state_shardings(abstract_state, mesh: Mesh):
    """A NamedSharding per leaf of a train state (params, optimizer state, step), by the FSDP rule.

    The rule depends on the leaf's shape only, so AdamW's moments (shaped like their parameters) land where their
    parameters are, and scalars (step, counts) are replicated. `abstract_state` may hold arrays or
    jax.ShapeDtypeStructs (e.g. from jax.eval_shape).
    """
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(tuple(x.shape), fsdp)), abstract_state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Token batches [B, T]: rows over ("data", "fsdp"), tokens over "sequence"."""
    return NamedSharding(mesh, P(BATCH_AXES, "sequence"))


def check_batch(batch_size: int, seq_len: int, mesh: Mesh, names=("data.batch_size", "data.seq_len")) -> None:
    """ValueError naming the key when the batch does not split evenly over the mesh."""
    rows = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % rows:
        raise ValueError(f"{names[0]} must be a multiple of mesh.data * mesh.fsdp = {rows}, got {batch_size}")
    if seq_len % mesh.shape["sequence"]:
        raise ValueError(f"{names[1]} must be a multiple of mesh.sequence = {mesh.shape['sequence']}, got {seq_len}")


def put_batch(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global array from the whole batch `x` (the same on every process: batch i is a function of the seed
    and i), each process placing only the shards of its own devices."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
