"""A run folder holds one run: resuming it with another model, data, optimizer or seed stops before any work with
the differing keys named; what only schedules the work may change; trainer.steps below the newest checkpoint is an
error, not a relabel; a second run in the same folder stops at once naming the other, and a refused launch leaves
the owning run's .hydra/ as it was; a rerun of a finished run rewrites a valid summary.json with the run's own
first loss."""

import json
import os
import signal

import pytest

from retention.train import train
from retention.train.lock import RunFolderBusy, RunLock
from tests.train.common import TINY, Output, compose_config, fresh_seed, saved_steps, start_train_py


def folder_state(run) -> dict:
    """Every file under the run's checkpoints/ with its size and modification time."""
    out = {}
    for root, _, files in os.walk(run / "checkpoints"):
        for name in files:
            stat = os.stat(os.path.join(root, name))
            out[os.path.join(root, name)] = (stat.st_size, stat.st_mtime_ns)
    return out


HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")


@pytest.mark.parametrize(
    "overrides, keys",
    [
        (["model.d_model=24"], ["model.d_model: 16 -> 24"]),
        (["model.target_params=20000"], ["model.target_params: None -> 20000"]),
        (["optim.lr=0.5", "seed=123"], ["optim.lr: 0.01 -> 0.5", "seed: "]),
        (["data.num_kv_pairs=3"], ["data.num_kv_pairs: 2 -> 3"]),
    ],
)
def test_changed_config_is_refused_before_any_work(finished_run, tmp_path, overrides, keys):
    run = finished_run.copy(tmp_path / "run")
    before = folder_state(run)
    with pytest.raises(ValueError, match="holds another run than this config") as info:
        train(compose_config([*finished_run.overrides, *overrides]), str(run))
    for key in keys:
        assert key in str(info.value)
    assert "hydra.run.dir=" in str(info.value)  # how to start a fresh run
    assert folder_state(run) == before  # nothing overwritten, nothing added


def test_a_checkpoint_of_another_run_is_refused_without_run_json(finished_run, tmp_path):
    """Checkpoints copied without run.json: each checkpoint's own record is checked."""
    run = finished_run.copy(tmp_path / "run")
    os.remove(run / "run.json")
    with pytest.raises(ValueError, match=r"checkpoint 4 in .* holds another run .*model.n_heads: 2 -> 1"):
        train(compose_config([*finished_run.overrides, "model.n_heads=1", "model.n_kv_heads=1"]), str(run))


def test_schedule_keys_may_change_and_steps_may_grow(finished_run, tmp_path, caplog):
    run = finished_run.copy(tmp_path / "run")
    more = ["trainer.steps=6", "trainer.log_every=2", "trainer.eval_scales=[1,2]", "trainer.keep=3", "mesh.data=1"]
    caplog.set_level("INFO")
    summary = train(compose_config([*finished_run.overrides, *more]), str(run))
    assert "resumed from the checkpoint at step 4" in caplog.text
    assert saved_steps(run) == [4, 5, 6] and summary["steps"] == 6 and set(summary["eval"]) == {"16", "32"}
    assert summary["initial_loss"] == finished_run.summary["initial_loss"]  # the run's first loss, not step 5's
    assert json.load(open(run / "run.json"))["config"]["trainer"]["steps"] == 6


def test_fewer_steps_than_saved_is_refused(finished_run, tmp_path):
    run = finished_run.copy(tmp_path / "run")
    before = folder_state(run)
    with pytest.raises(ValueError, match=r"trainer.steps=2 is below step 4, the newest checkpoint of the run"):
        train(compose_config([*finished_run.overrides, "trainer.steps=2"]), str(run))
    assert folder_state(run) == before and saved_steps(run) == [1, 2, 3, 4]


def test_rerun_of_a_finished_run_writes_a_valid_summary(finished_run, tmp_path):
    run = finished_run.copy(tmp_path / "run")
    summary = train(compose_config(finished_run.overrides), str(run))
    text = (run / "summary.json").read_text()
    assert "NaN" not in text and json.loads(text) == summary  # json.loads accepts NaN: the text must not hold it
    for key in ("initial_loss", "train_loss", "tokens_per_s", "final_loss"):
        assert summary[key] == finished_run.summary[key], key  # kept from the run's checkpoint
    assert summary["train_traces"] == 0 and summary["compile_s"] is None and summary["resumed_from"] == 4


@pytest.mark.integration
def test_a_second_run_in_the_same_folder_stops_at_once(tmp_path):
    """A second launch while the first trains stops at once naming it (the lock), the first trains on; SIGTERM then
    saves the first's checkpoint and it exits with 128 + 15, without summary.json; a launch with another seed is
    refused by the record check. Neither refused launch changes the first run's .hydra/ files."""
    overrides = [*TINY, "trainer.steps=100000", "trainer.ckpt_every=100000", f"seed={fresh_seed()}"]
    first = start_train_py(tmp_path, overrides)
    out_first = Output(first)
    try:
        assert out_first.wait_for("step 3:", timeout=120), out_first.text()
        hydra = {name: (tmp_path / ".hydra" / name).read_bytes() for name in HYDRA_FILES}
        assert b"trainer.steps=100000" in hydra["overrides.yaml"]
        second = start_train_py(tmp_path, [*TINY, "trainer.steps=3", "seed=2"])
        out_second = Output(second)
        assert second.wait(timeout=120) != 0, out_second.text()
        text = out_second.text()
        assert f"another run is training in {tmp_path} (pid {first.pid} on host" in text, text
        assert first.poll() is None  # the first one trains on
    finally:
        first.send_signal(signal.SIGTERM)
        code = first.wait(timeout=60)
    assert code == 128 + signal.SIGTERM, out_first.text()
    steps = saved_steps(tmp_path)
    assert len(steps) == 1 and steps[0] >= 3, (steps, out_first.text())
    assert f"saved the checkpoint at step {steps[0]}" in out_first.text()
    assert not (tmp_path / "summary.json").exists()

    other_seed = start_train_py(tmp_path, [*overrides[:-1], "seed=1"])
    out = other_seed.communicate(timeout=300)[0]
    assert other_seed.returncode != 0 and "holds another run than this config" in out, out[-3000:]
    assert {name: (tmp_path / ".hydra" / name).read_bytes() for name in HYDRA_FILES} == hydra


def test_lock_is_released_when_its_holder_ends(tmp_path):
    with RunLock(str(tmp_path)):
        with pytest.raises(RunFolderBusy, match=f"pid {os.getpid()}"):
            RunLock(str(tmp_path)).__enter__()
    with RunLock(str(tmp_path)):  # free again
        pass
