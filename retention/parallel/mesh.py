"""The device mesh from config, and multi-host start-up through `jax.distributed`.

The mesh has four named axes over all devices (of every process): "data" (pure data parallelism: the batch is
split, parameters replicated), "fsdp" (the batch is split and each parameter is sharded over its model-width
dimension), "sequence" (the tokens of each sequence are split: context parallelism, see
`retention/ops/*/context_parallel.py`) and "tensor" (tensor parallelism: heads, MLP and vocabulary split). What
goes where is the logical-axis rules' (`rules.py`, the config's `mesh.rules`). Every axis is `AxisType.Auto`:
sharding is propagated by XLA, so the model code runs unchanged under the mesh.
"""

import logging
import math
import os

import jax
from jax.sharding import AxisType, Mesh

log = logging.getLogger(__name__)

AXES = ("data", "fsdp", "sequence", "tensor")  # tensor last: the axis of the most traffic on the nearest devices
# Environment variables that say a multi-process job was started by a launcher that JAX's
# `jax.distributed.initialize()` reads on its own: marker -> the variable holding the process count. For Slurm,
# the tasks of the current step (srun, as submitit uses), not of the allocation: a lone `python train.py` inside
# `salloc -n 4` is one process and must not wait for three others.
CLUSTER_ENV = {
    "SLURM_JOB_ID": "SLURM_STEP_NUM_TASKS",
    "OMPI_COMM_WORLD_SIZE": "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE": "PMI_SIZE",
}


def mesh_shape(data: int, fsdp: int, sequence: int, n_devices: int, tensor: int = 1) -> tuple[int, int, int, int]:
    """The (data, fsdp, sequence, tensor) sizes over `n_devices`: -1 in one axis means "the devices the others
    leave".

    Raises ValueError naming `mesh.<axis>`, its value and what is allowed when a size is not a positive int
    (or -1), when more than one is -1, or when the product is not `n_devices`.
    """
    sizes = {"data": data, "fsdp": fsdp, "sequence": sequence, "tensor": tensor}
    given = ", ".join(f"mesh.{name}={value}" for name, value in sizes.items())
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or not (value >= 1 or value == -1):
            raise ValueError(f"mesh.{name} must be a positive int or -1 (the devices left), got {value!r}")
    free = [name for name, value in sizes.items() if value == -1]
    if len(free) > 1:
        raise ValueError(
            f"at most one of mesh.data, mesh.fsdp, mesh.sequence, mesh.tensor may be -1, got {free} all -1"
        )
    if free:
        fixed = math.prod(v for v in sizes.values() if v != -1)
        if n_devices % fixed:
            raise ValueError(
                f"mesh.{free[0]}=-1 needs the other axes' product ({fixed}) to divide the device count "
                f"{n_devices}, got {given}"
            )
        sizes[free[0]] = n_devices // fixed
    if math.prod(sizes.values()) != n_devices:
        raise ValueError(
            f"mesh.data * mesh.fsdp * mesh.sequence * mesh.tensor must equal the device count {n_devices}, got "
            f"{given} (product {math.prod(sizes.values())})"
        )
    return tuple(sizes[name] for name in AXES)


def make_mesh(data: int = -1, fsdp: int = 1, sequence: int = 1, tensor: int = 1, *, devices=None) -> Mesh:
    """A Mesh with axes ("data", "fsdp", "sequence", "tensor") over `devices` (default: every device of every
    process), all `AxisType.Auto`. Sizes as in `mesh_shape`; `jax.make_mesh` orders the devices for the
    interconnect."""
    devices = jax.devices() if devices is None else list(devices)
    shape = mesh_shape(data, fsdp, sequence, len(devices), tensor)
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def cluster_detected(environ=None) -> bool:
    """Whether the environment shows a scheduler-started job of more than one process (see CLUSTER_ENV)."""
    environ = os.environ if environ is None else environ
    for marker, size_var in CLUSTER_ENV.items():
        if marker in environ:
            try:
                return int(environ.get(size_var, "1")) > 1
            except ValueError:
                return False
    return False


def initialize_distributed(
    coordinator_address: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> bool:
    """Join a multi-process JAX job; returns whether `jax.distributed.initialize` ran (now or before).

    - `coordinator_address` given: `jax.distributed.initialize(coordinator_address, num_processes, process_id)`
      (both required: "host:port" of process 0, the process count, this process's rank);
    - else, in a multi-process job started by Slurm (srun, or Hydra's submitit launcher with several tasks) or
      mpirun: `jax.distributed.initialize()`, which reads all of it from the environment (on Slurm one
      process per GPU: each takes the GPU of its SLURM_LOCALID);
    - else (one process): nothing.
    Call it before any other JAX call that touches devices.
    """
    if jax.distributed.is_initialized():
        return True
    if coordinator_address is not None:
        for name, value in (("num_processes", num_processes), ("process_id", process_id)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"mesh.{name} must be a non-negative int when mesh.coordinator_address is set, got {value!r}"
                )
        if process_id >= num_processes:
            raise ValueError(f"mesh.process_id must be < mesh.num_processes={num_processes}, got {process_id}")
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
    elif num_processes is not None or process_id is not None:
        raise ValueError(
            "mesh.num_processes and mesh.process_id need mesh.coordinator_address ('host:port'), got "
            f"coordinator_address=None, num_processes={num_processes}, "
            f"process_id={process_id}"
        )
    elif cluster_detected():
        jax.distributed.initialize()
    else:
        return False
    log.info(
        "process %d of %d; %d local devices, %d in all",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return True
