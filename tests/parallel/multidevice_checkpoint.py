"""Checkpoints across meshes on 8 host devices (run by test_eight_devices.py): a state saved under a
(data, fsdp, sequence) = (1, 4, 2) mesh restores onto (1, 8, 1) and (8, 1, 1) with the same values in the new
shardings (its checksums, summed shard by shard, agree on every mesh), and a run resumed under another mesh
ends with the parameters of an uninterrupted run; load_run places a run's parameters over a mesh; a bad mesh
stops the trainer at start-up with the key named."""

import logging
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from retention import load_run
from retention.parallel import make_mesh, state_shardings
from retention.train import build, train
from retention.train.checkpoint import Checkpoints
from retention.train.optimizer import make_optimizer
from retention.train.step import make_init
from tests.helpers import rel_err
from tests.parallel.common import require_devices
from tests.train.common import TINY, compose_config

require_devices()
pytestmark = pytest.mark.integration  # run by test_eight_devices.py's integration test, in its tier

OVERRIDES = [*TINY, "data.batch_size=8", "trainer.eval_scales=[1]", "model.d_model=24", "data.vocab_size=40"]


def _seed() -> int:
    return int(np.random.SeedSequence().generate_state(1)[0] % 2**31)


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def test_state_saved_on_one_mesh_restores_on_another(tmp_path):
    cfg = compose_config([*OVERRIDES, f"seed={_seed()}"])
    lm, _ = build(cfg)
    tx, _ = make_optimizer(cfg.optim, cfg.trainer.steps)
    init = make_init(lm, tx, cfg.seed)
    abstract = jax.eval_shape(init)
    written_on = state_shardings(abstract, make_mesh(1, 4, 2))
    state = jax.jit(init, out_shardings=written_on)()
    state["step"] = state["step"] + 7
    ckpt = Checkpoints(str(tmp_path), every=1, keep=2)
    ckpt.save(7, state, progress={})
    ckpt.close()
    for target in ((1, 8, 1), (8, 1, 1)):
        shardings = state_shardings(abstract, make_mesh(*target))
        ckpt = Checkpoints(str(tmp_path), every=1, keep=2)
        step, restored = ckpt.restore_latest(abstract, shardings)[:2]  # checksums verified on the new mesh
        ckpt.close()
        assert not os.path.exists(f"{tmp_path}_damaged")
        assert step == 7 and int(restored["step"]) == 7
        moved = 0
        for got, want, sharding, before in zip(
            jax.tree.leaves(restored), jax.tree.leaves(state), jax.tree.leaves(shardings), jax.tree.leaves(written_on)
        ):
            assert got.sharding == sharding
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            moved += got.sharding.shard_shape(got.shape) != before.shard_shape(got.shape)
        assert moved > 0, target  # the shards really are cut differently


@pytest.mark.slow  # a further case: a state restored on another mesh (above); a resume on one device (test_checkpoint)
def test_run_resumed_on_another_mesh_matches_uninterrupted(tmp_path, caplog):
    """4 steps on mesh (1, 4, 2) saving every 2; then step 2's checkpoint alone, resumed on (1, 8, 1) for steps
    3 and 4: the parameters match the uninterrupted run's to float32 rounding."""
    caplog.set_level(logging.INFO)
    common = [*OVERRIDES, "trainer.steps=4", "trainer.ckpt_every=2", "trainer.keep=5", f"seed={_seed()}"]
    whole, moved = tmp_path / "whole", tmp_path / "moved"
    train(compose_config([*common, "mesh.data=1", "mesh.fsdp=4", "mesh.sequence=2"]), str(whole))
    shutil.copytree(whole / "checkpoints" / "2", moved / "checkpoints" / "2")
    caplog.clear()
    summary = train(compose_config([*common, "mesh.data=1", "mesh.fsdp=8", "mesh.sequence=1"]), str(moved))
    assert "resumed from the checkpoint at step 2" in caplog.text
    assert np.isfinite(summary["final_loss"])
    load = lambda run: ocp.StandardCheckpointer().restore(os.path.join(run, "checkpoints", "4", "state"))["params"]
    a, b = load(whole), load(moved)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert rel_err(_flat(b), _flat(a)) < 1e-5
    mesh = make_mesh(1, 8, 1)
    model, cfg, _ = load_run(str(moved), mesh=mesh)  # parameters only, FSDP-sharded over the mesh
    params = jax.tree.leaves(nnx.state(model))
    assert any(len(p.sharding.device_set) == 8 and not p.sharding.is_fully_replicated for p in params)
    np.testing.assert_array_equal(_flat(params), _flat(b))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["mesh.data=3"],
            r"mesh.data \* mesh.fsdp \* mesh.sequence \* mesh.tensor must equal the device count 8, got "
            r"mesh.data=3, mesh.fsdp=1, mesh.sequence=1, mesh.tensor=1 \(product 3\)",
        ),
        (["mesh.fsdp=3"], r"mesh.data=-1 needs the other axes' product \(3\) to divide the device count 8"),
        (
            ["mesh.data=-1", "mesh.fsdp=-1"],
            r"at most one of mesh.data, mesh.fsdp, mesh.sequence, mesh.tensor may be -1",
        ),
        (["mesh.sequence=0"], r"mesh.sequence must be a positive int or -1 \(the devices left\), got 0"),
        (["mesh.sequence=8", "data.seq_len=12"], r"data.seq_len must be a multiple of mesh.sequence = 8, got 12"),
        (
            ["mesh.data=8", "data.batch_size=4"],
            r"data.batch_size must be a multiple of mesh.data \* mesh.fsdp = 8, got 4",
        ),
        (["mesh.num_processes=2"], r"mesh.num_processes and mesh.process_id need mesh.coordinator_address"),
    ],
)
def test_bad_mesh_stops_at_start(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        train(compose_config([*TINY, *overrides]), str(tmp_path))
    assert not os.path.exists(tmp_path / "checkpoints")  # stopped before anything was made
