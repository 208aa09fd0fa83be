"""The mesh arithmetic, the FSDP rule and the multi-host start-up checks, in-process (one device): the sizes
with -1, every bad shape naming `mesh.<axis>`, the axis each parameter is sharded on, and when
jax.distributed is (not) started."""

import jax
import pytest
from jax.sharding import AxisType

from retention.parallel import initialize_distributed, make_mesh, mesh_shape
from retention.parallel.mesh import cluster_detected


@pytest.mark.parametrize(
    "sizes,n,want",
    [
        ((-1, 1, 1), 8, (8, 1, 1, 1)),
        ((2, -1, 2), 8, (2, 2, 2, 1)),
        ((1, 2, -1), 16, (1, 2, 8, 1)),
        ((4, 2, 1), 8, (4, 2, 1, 1)),
        ((-1, 3, 1), 6, (2, 3, 1, 1)),
        ((1, 2, 1, -1), 8, (1, 2, 1, 4)),
        ((-1, 1, 1, 4), 8, (2, 1, 1, 4)),
    ],
)
def test_mesh_shape_fills_the_free_axis(sizes, n, want):
    assert mesh_shape(*sizes[:3], n, *sizes[3:]) == want


@pytest.mark.parametrize(
    "sizes,n,message",
    [
        ((2, 2, 1), 8, r"device count 8, got mesh.data=2, mesh.fsdp=2, mesh.sequence=1, mesh.tensor=1 \(product 4\)"),
        ((1, 1, 1, 0), 8, r"mesh.tensor must be a positive int or -1 \(the devices left\), got 0"),
        ((1, 1, -1, -1), 8, r"at most one of .* may be -1"),
        ((1, 3, -1), 8, r"mesh.sequence=-1 needs the other axes' product \(3\) to divide the device count 8"),
        ((-1, -1, 1), 8, r"at most one of .* may be -1"),
        ((1, 0, 1), 1, r"mesh.fsdp must be a positive int or -1 \(the devices left\), got 0"),
        ((1, 1, 2.0), 2, r"mesh.sequence must be a positive int or -1 .*, got 2.0"),
        ((True, 1, 1), 1, r"mesh.data must be a positive int or -1 .*, got True"),
    ],
)
def test_bad_mesh_shape_names_the_axis(sizes, n, message):
    with pytest.raises(ValueError, match=message):
        mesh_shape(*sizes[:3], n, *sizes[3:])


def test_default_mesh_on_this_machine():
    mesh = make_mesh()
    assert mesh.axis_names == ("data", "fsdp", "sequence", "tensor")
    assert dict(mesh.shape) == {"data": jax.device_count(), "fsdp": 1, "sequence": 1, "tensor": 1}
    assert mesh.axis_types == (AxisType.Auto,) * 4  # sharding propagation, so the model code is unchanged
    with pytest.raises(ValueError, match=f"must equal the device count {jax.device_count()}"):
        make_mesh(jax.device_count() + 1, 1, 1)


@pytest.mark.parametrize(
    "env,want",
    [
        ({}, False),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "1"}, False),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "4"}, True),
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, False),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, True),
        ({"PMI_SIZE": "1"}, False),
    ],
)
def test_cluster_detection(env, want):
    assert cluster_detected(env) is want


def test_single_process_start_up_does_nothing(monkeypatch):
    for var in ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert initialize_distributed() is False and not jax.distributed.is_initialized()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(coordinator_address="h:1234", num_processes=None, process_id=0), "mesh.num_processes must be"),
        (dict(coordinator_address="h:1234", num_processes=2, process_id=-1), "mesh.process_id must be a non-negative"),
        (dict(coordinator_address="h:1234", num_processes=2, process_id=2), r"mesh.process_id must be < mesh.num"),
        (dict(num_processes=2, process_id=0), "need mesh.coordinator_address"),
    ],
)
def test_bad_distributed_config_names_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        initialize_distributed(**kwargs)
    assert not jax.distributed.is_initialized()
