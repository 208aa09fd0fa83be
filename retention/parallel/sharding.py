"""Shardings from the logical-axis rules (`rules.py`): the train state (parameters and optimizer state) by each
parameter's logical names, batches by ("batch", "sequence").

All of it is `jax.sharding.NamedSharding` over the mesh of `mesh.py`; XLA's sharding propagation inserts the
collectives (all-gather of a weight before its matmul, reduce-scatter of its gradient, the all-reduce after a
tensor-parallel matmul), so the model and the step are the same code on one device and on many.
"""

import jax
import numpy as np
from flax import nnx
from flax.core import spmd as core_spmd
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from retention.parallel.rules import DEFAULT_RULES, fit_spec, rule_size

BATCH = ("batch", "sequence")  # the logical names of a token batch [B, T]


def state_shardings(abstract_state, mesh: Mesh, rules=DEFAULT_RULES):
    """A NamedSharding per leaf of a train state (params, optimizer state, step) or of a model's state.

    Each parameter's logical names (its `out_sharding` metadata) resolve through `rules` (Flax's
    `nnx.logical_axis_rules` and `nnx.get_partition_spec`), then `fit_spec` keeps the mesh axes that divide its
    dimensions. AdamW's moments keep their parameters' metadata, so they land where their parameters are; leaves
    without names (step, counts) are replicated. `abstract_state` may hold arrays or jax.ShapeDtypeStructs (e.g.
    from jax.eval_shape).
    """
    with nnx.logical_axis_rules(rules):
        specs = nnx.get_partition_spec(abstract_state)
    mesh_shape = dict(mesh.shape)
    return jax.tree.map(
        lambda spec, x: NamedSharding(mesh, fit_spec(spec, tuple(x.shape), mesh_shape)), specs, abstract_state
    )


def batch_sharding(mesh: Mesh, rules=DEFAULT_RULES) -> NamedSharding:
    """Token batches [B, T]: rows over the "batch" rule's mesh axes, tokens over the "sequence" rule's (by
    default rows over ("data", "fsdp"), tokens over "sequence")."""
    return NamedSharding(mesh, P(*core_spmd.from_sharding_rules(BATCH, rules)))


def check_batch(
    batch_size: int, seq_len: int, mesh: Mesh, names=("data.batch_size", "data.seq_len"), rules=DEFAULT_RULES
) -> None:
    """ValueError naming the key when the batch does not split evenly over the mesh axes of its rules."""
    for logical, name, value in zip(BATCH, names, (batch_size, seq_len)):
        size = rule_size(logical, mesh, rules)
        if value % size:
            axes = dict(rules).get(logical)
            axes = (axes,) if isinstance(axes, str) else axes
            raise ValueError(
                f"{name} must be a multiple of {' * '.join(f'mesh.{a}' for a in axes)} = {size}, got {value}"
            )


def put_batch(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global array from the whole batch `x` (the same on every process: batch i is a function of the seed
    and i), each process placing only the shards of its own devices."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
