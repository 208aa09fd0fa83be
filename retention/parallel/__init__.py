"""Scale-out: the device mesh (data, FSDP, sequence, tensor), multi-host start-up, the logical-axis rules and the
shardings they give.

Context-parallel ops (the sequence split across devices) are in `retention/ops/*/context_parallel.py`.
"""

from retention.parallel.mesh import AXES, initialize_distributed, make_mesh, mesh_shape
from retention.parallel.rules import DEFAULT_RULES, LOGICAL_AXES, check_heads_split, check_rules, constrain
from retention.parallel.sharding import batch_sharding, check_batch, put_batch, state_shardings

__all__ = [
    "AXES",
    "DEFAULT_RULES",
    "LOGICAL_AXES",
    "batch_sharding",
    "check_batch",
    "check_heads_split",
    "check_rules",
    "constrain",
    "initialize_distributed",
    "make_mesh",
    "mesh_shape",
    "put_batch",
    "state_shardings",
]
