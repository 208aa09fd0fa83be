"""Logical axes: the names the model gives each dimension of its parameters and activations, and the rules that
map them to the mesh's axes (MaxText's style: a list of (logical name, mesh axis or axes or None) pairs).

The model annotates each parameter through Flax NNX's variable metadata (`out_sharding`, a logical name per
dimension; `logical_param`) and each activation it constrains through `constrain`; the names resolve through
`flax.nnx.logical_axis_rules` (the rules in context) and `nnx.get_partition_spec`. `fit_spec` then keeps only
the mesh axes that split a dimension: an axis of size 1, an axis the array already uses on another dimension,
or one whose size (times the axes kept before it) does not divide the dimension is left out (that dimension is
replicated over it). So one rule set serves every mesh: with tensor=1 the tensor rules split nothing.
"""

import math

import jax
from flax.core import spmd as core_spmd
from jax.sharding import PartitionSpec as P

from retention.parallel.mesh import AXES

# The logical names the model uses, and what each dimension holds.
LOGICAL_AXES = {
    "batch": "the rows of a batch (activations)",
    "sequence": "the tokens of a sequence (activations)",
    "embed": "the model width d_model",
    "vocab": "the vocabulary (embedding rows, logits)",
    "heads": "the query heads (n_heads, or n_heads * head_dim channels)",
    "kv_heads": "the key/value heads (n_kv_heads, or n_kv_heads * head_dim channels)",
    "mlp": "the SwiGLU hidden width",
    "head_dim": "the channels inside one head (QK norm, output norm)",
    "conv_taps": "the short convolution's taps",
    "gate_rank": "GLA's low-rank decay projection",
    "ssm_heads": "Mamba2's heads (H, or d_inner = H * head_dim channels)",
    "ssm_groups": "Mamba2's B and C channels (n_groups * state size)",
    "ssm_proj": "Mamba2's fused input projection (z, x, B, C, dt) and its conv bias",
    "layers": "the repeats of the scanned layers' stack",
}

# The default rules (configs/mesh/auto.yaml lists the same): the batch over data and fsdp, the tokens over
# sequence, every parameter's model-width dimension over fsdp (FSDP), heads, MLP and vocabulary over tensor.
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("sequence", "sequence"),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("ssm_heads", "tensor"),
    ("head_dim", None),
    ("conv_taps", None),
    ("gate_rank", None),
    ("ssm_groups", None),
    ("ssm_proj", None),
    ("layers", None),
)

# The logical names of the activations the model constrains.
BTD = ("batch", "sequence", "embed")
BTV = ("batch", "sequence", "vocab")
BTF = ("batch", "sequence", "mlp")
BTHD = ("batch", "sequence", "heads", "head_dim")
BTKD = ("batch", "sequence", "kv_heads", "head_dim")


def check_rules(rules, name: str = "mesh.rules") -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """`rules` as a tuple of (logical name, None | mesh axis | tuple of mesh axes); ValueError naming `name`, the
    entry and what is allowed for anything else: not a list of pairs, an unknown logical name or mesh axis, a
    logical name given twice, a mesh axis repeated in one rule."""
    if isinstance(rules, (str, bytes)) or not hasattr(rules, "__iter__"):
        raise ValueError(f"{name} must be a list of [logical name, mesh axis or axes or null] pairs, got {rules!r}")
    out, seen = [], {}
    for i, rule in enumerate(rules):
        if isinstance(rule, (str, bytes)) or not hasattr(rule, "__len__") or len(rule) != 2:
            raise ValueError(f"{name}[{i}] must be a [logical name, mesh axis or axes or null] pair, got {rule!r}")
        logical, axes = rule
        if logical not in LOGICAL_AXES:
            raise ValueError(f"{name}[{i}]: unknown logical axis {logical!r}; allowed: {sorted(LOGICAL_AXES)}")
        if logical in seen:
            raise ValueError(f"{name} gives {logical!r} twice ({name}[{seen[logical]}] and [{i}]): one rule each")
        seen[logical] = i
        listed = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        for axis in listed:
            if axis not in AXES:
                raise ValueError(
                    f"{name}[{i}] ({logical!r}): unknown mesh axis {axis!r}; allowed: {list(AXES)}, a list of "
                    "them, or null"
                )
        if len(set(listed)) != len(listed):
            raise ValueError(f"{name}[{i}] ({logical!r}) repeats a mesh axis: {list(listed)}")
        out.append((logical, None if not listed else listed[0] if len(listed) == 1 else listed))
    return tuple(out)


def fit_spec(spec, shape: tuple[int, ...], mesh_shape) -> P:
    """The PartitionSpec of an array of `shape` from `spec` (one entry per dimension: None, a mesh axis, a tuple
    of them; any other name, a logical axis without a rule, is None), keeping per dimension the mesh axes of size
    > 1 not used before in the array whose running product divides the dimension (`mesh_shape`: axis -> size)."""
    used, out = set(), []
    for entry, n in zip((*spec, *(None,) * (len(shape) - len(spec))), shape):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        kept, size = [], 1
        for axis in axes:
            if axis in mesh_shape and axis not in used and mesh_shape[axis] > 1 and n % (size * mesh_shape[axis]) == 0:
                kept.append(axis)
                size *= mesh_shape[axis]
        used.update(kept)
        out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def logical_spec(names: tuple[str | None, ...], shape: tuple[int, ...], mesh_shape, rules) -> P:
    """The PartitionSpec of an array of `shape` whose dimensions have the logical `names`, under `rules`."""
    return fit_spec(core_spmd.from_sharding_rules(names, rules), shape, mesh_shape)


def logical_param(*names: str) -> dict:
    """The variable metadata of a parameter whose dimensions have the logical `names` (for nnx.Param(...,
    **logical_param(...)) or a layer's kernel_metadata): the names, and no sharding at creation (a model is made
    the same with or without a mesh; the trainer places the state by `sharding.state_shardings`)."""
    return {"out_sharding": names, "eager_sharding": False}


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
    """`x` constrained to the mesh axes its logical `names` map to under the rules in context
    (`nnx.logical_axis_rules`) and the mesh set by `jax.set_mesh`; `x` itself when either is absent."""
    mesh, rules = jax.sharding.get_abstract_mesh(), core_spmd.get_logical_axis_rules()
    if mesh.empty or not rules:
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(names, x.shape, dict(mesh.shape), rules))


def rule_size(logical: str, mesh, rules) -> int:
    """How many ways the mesh axes of `logical`'s rule split a dimension (1 without a rule)."""
    axes = dict(rules).get(logical)
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape[a] for a in axes)


def check_heads_split(n_heads: int, n_kv_heads: int, mesh, rules, names=("model.n_heads", "model.n_kv_heads")):
    """ValueError naming them when the mesh axes of the `heads` or `kv_heads` rule (e.g. tensor) do not divide
    n_heads or n_kv_heads: a tensor-parallel mesh splits whole heads."""
    for logical, key, value in (("heads", names[0], n_heads), ("kv_heads", names[1], n_kv_heads)):
        size = rule_size(logical, mesh, rules)
        if value % size:
            axes = dict(rules)[logical]
            raise ValueError(
                f"{key}={value} must be a multiple of {size}, the size of mesh axes {axes!r} that the rule "
                f"{logical!r} splits heads over (n_heads={n_heads}, n_kv_heads={n_kv_heads}); change the mesh "
                f"(e.g. mesh.tensor) or the heads"
            )
