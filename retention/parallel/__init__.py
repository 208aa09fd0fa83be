"""Scale-out: the device mesh (data, FSDP, sequence), multi-host start-up, and the sharding rules.

Context-parallel ops (the sequence split across devices) are in `retention/ops/*/context_parallel.py`.
"""

from retention.parallel.mesh import AXES, BATCH_AXES, initialize_distributed, make_mesh, mesh_shape
from retention.parallel.sharding import (
    batch_sharding,
    check_batch,
    fsdp_spec,
    put_batch,
    state_shardings,
)

__all__ = [
    "AXES",
    "BATCH_AXES",
    "batch_sharding",
    "check_batch",
    "fsdp_spec",
    "initialize_distributed",
    "make_mesh",
    "mesh_shape",
    "put_batch",
    "state_shardings",
]
