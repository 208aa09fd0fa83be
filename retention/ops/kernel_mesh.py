"""Kernels under a mesh: Pallas (Mosaic, Triton) calls cannot be partitioned by XLA, so the ops run them inside a
`jax.shard_map` over the batch and head axes of the ambient mesh (`jax.set_mesh`), each device on its own rows and
heads, with no gather of q, k, v.

`shard_plan(q, H)` reads the mesh: every axis of more than one device that is not already manual (inside a
shard_map, such as the context-parallel ops', the kernels run as they are) splits the batch when B divides, else
the kv-heads when H divides (then the query heads split the same way: query head i reads kv-head i // (Hq // H)), else
the kernel runs replicated over it (still inside the shard_map: XLA cannot partition a Mosaic call at all). On
an Explicit axis the plan takes q's own sharding of those dims instead.
`run_sharded` then calls a function under that plan, each argument and output named by the role of its dims.
"""

import math
from typing import NamedTuple

import jax
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

BATCH, HEADS = "batch", "heads"  # the roles of an array's dims; None: not split


class ShardPlan(NamedTuple):
    """The mesh axes that split the batch and the heads (None: not split)."""

    mesh: object
    batch: tuple[str, ...] | None
    heads: tuple[str, ...] | None


def _axes(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def shard_plan(q, H: int) -> ShardPlan | None:
    """How to split a kernel call on q [B, T, Hq, d] with H kv-heads over the ambient mesh (module docstring);
    None when there is no mesh to run under (no mesh, or every axis manual or of size 1)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return None
    free = [a for a in mesh.axis_names if mesh.shape[a] > 1 and a not in mesh.manual_axes]
    if not free:
        return None
    explicit = [a for a in free if _axis_type(mesh, a) == AxisType.Explicit]
    if explicit:  # the input says where it is
        spec = jax.typeof(q).sharding.spec
        batch, heads = _axes(spec[0]), _axes(spec[2])
    else:
        batch, heads = [], []
        for a in free:
            n = mesh.shape[a]
            if q.shape[0] % (math.prod(mesh.shape[b] for b in batch) * n) == 0:
                batch.append(a)
            elif H % (math.prod(mesh.shape[h] for h in heads) * n) == 0:
                heads.append(a)
    return ShardPlan(mesh, tuple(batch) or None, tuple(heads) or None)


def _axis_type(mesh, axis: str):
    return dict(zip(mesh.axis_names, mesh.axis_types))[axis]


def _spec(plan: ShardPlan, roles) -> P:
    """The PartitionSpec of an array whose dims have `roles` (BATCH, HEADS or None each)."""
    return P(*({BATCH: plan.batch, HEADS: plan.heads}.get(r) for r in roles))


def run_sharded(fn, plan: ShardPlan, args: tuple, arg_roles: tuple, out_roles, *, check_vma: bool = True):
    """fn(*args) inside a shard_map of `plan`: `arg_roles` gives each argument's dim roles (None for an argument
    that is None), `out_roles` the outputs' as a pytree prefix (tuples of roles at its leaves). `check_vma` is the
    shard_map's (off for kernels in interpret mode: `pallas.interpreted`)."""
    present = [i for i, a in enumerate(args) if a is not None]
    is_roles = lambda x: isinstance(x, tuple) and all(r in (BATCH, HEADS, None) for r in x)
    out_specs = jax.tree.map(lambda roles: _spec(plan, roles), out_roles, is_leaf=is_roles)
    in_specs = tuple(_spec(plan, arg_roles[i]) for i in present)
    if any(_axis_type(plan.mesh, a) == AxisType.Explicit for a in plan.mesh.axis_names):
        args = tuple(a if a is None else jax.sharding.reshard(a, _spec(plan, r)) for a, r in zip(args, arg_roles))

    def local(*given):
        full = [None] * len(args)
        for i, x in zip(present, given):
            full[i] = x
        return fn(*full)

    run = jax.shard_map(local, mesh=plan.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma)
    return run(*(args[i] for i in present))
