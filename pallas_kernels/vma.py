"""Kernels inside `jax.shard_map`: with check_vma (the default), every value records the mesh axes it varies over
(its manual axis type), and a `pallas_call`'s outputs must say theirs. The kernels' entry points make all their
array inputs vary over the same axes (`same_varying`: `pcast` to varying, whose transpose sums the cotangent back
over the axes an input did not vary over) and give every output that type (`out_struct`). Outside a shard_map the
type is empty and both are no-ops."""

import jax


def _varying(x) -> frozenset:
    return jax.typeof(x).manual_axis_type.varying


def same_varying(*xs):
    """xs, each cast to vary over the union of the axes any of them varies over (None entries pass through)."""
    axes = frozenset().union(*(_varying(x) for x in xs if x is not None))

    def cast(x):
        missing = () if x is None else tuple(sorted(axes - _varying(x)))
        return jax.lax.pcast(x, missing, to="varying") if missing else x

    return tuple(cast(x) for x in xs)


def out_struct(shape, dtype, like) -> jax.ShapeDtypeStruct:
    """A pallas_call output of `shape` and `dtype` varying over the mesh axes `like` (an input) varies over."""
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).manual_axis_type)
