"""What a run writes stays in its folder, and a refused launch changes nothing there: the lock file is never
followed through a symbolic link, model.name cannot lead out of the outputs or sweep folder, a misspelt key added
with `+` stops the run, and a launch refused by the lock or the record check leaves the owning run's .hydra/ as
it was (the quick test of the refusals: test_run_folder.py's second-run test); a launch refused before its run
begins leaves no run folder it made."""

import os
import subprocess
import sys

import pytest

from retention.train import build
from retention.train.lock import RunLock
from tests.train.common import ROOT, TINY, compose_config, fresh_seed, start_train_py


def test_a_lock_file_that_is_a_symlink_is_refused(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(outside, run / "train.lock")
    with pytest.raises(ValueError, match=r"train.lock is a symbolic link .*precious.txt"):
        with RunLock(str(run)):
            pass
    assert outside.read_text() == "keep me"


@pytest.mark.parametrize("name", ["x/../../../escaped", "..", "a\\b", ""])
def test_a_model_name_with_a_path_is_refused(name):
    with pytest.raises(ValueError, match=r"model.name must be a folder name .*got " + repr(name).replace("\\", "\\\\")):
        build(compose_config([*TINY, f"model.name='{name}'"]))


@pytest.mark.integration
def test_a_sweep_never_writes_outside_its_folder(tmp_path):
    sweep = tmp_path / "a" / "b" / "sweep"
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", f"hydra.sweep.dir={sweep}", *TINY, "model.name=x/../../../escaped"],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "model.name must be a folder name" in proc.stdout + proc.stderr
    assert not (tmp_path / "a" / "escaped").exists()
    assert not any("escaped" in str(p) for p in tmp_path.rglob("*"))


def test_an_unknown_key_is_refused_naming_it():
    cfg = compose_config([*TINY, "+model.d_modle=64"])
    with pytest.raises(
        ValueError, match=r"unknown config key model.d_modle: the keys of the model group are \[.*'d_model'"
    ):
        build(cfg)


@pytest.mark.integration
@pytest.mark.slow  # a further case: test_run_folder's second-run test checks both refusals leave .hydra/ as it was
def test_a_refused_launch_leaves_the_runs_hydra_files_unchanged(tmp_path):
    run = tmp_path / "run"
    first = [*TINY, "trainer.steps=2", "trainer.eval_scales=[1]"]
    proc = start_train_py(run, [*first, f"seed={fresh_seed()}"])
    assert proc.wait(timeout=300) == 0, proc.stdout.read()[-3000:]
    hydra = {name: (run / ".hydra" / name).read_bytes() for name in ("config.yaml", "hydra.yaml", "overrides.yaml")}
    assert b"trainer.steps=2" in hydra["overrides.yaml"]

    other_seed = start_train_py(run, [*first, "seed=1"])  # another run: refused by the record check
    out = other_seed.communicate(timeout=300)[0]
    assert other_seed.returncode != 0 and "holds another run than this config" in out, out[-3000:]
    with RunLock(str(run)):  # the folder busy: refused by the lock
        busy = start_train_py(run, [*first, "trainer.steps=3", "seed=2"])
        out = busy.communicate(timeout=300)[0]
    assert busy.returncode != 0 and "another run is training in" in out, out[-3000:]
    assert {name: (run / ".hydra" / name).read_bytes() for name in hydra} == hydra


@pytest.mark.integration
def test_a_refused_start_leaves_no_run_folder_it_made(tmp_path):
    """A start refused before its run begins (a bad config value) removes the run folder it made, and the empty
    folders above it it made; a folder that was there before keeps what it held; a sweep's refused job leaves
    only the sweep's own multirun.yaml."""
    bad = [*TINY, "trainer.ckpt_every=0"]
    for run in (tmp_path / "new" / "deeper" / "run", tmp_path / "there"):
        if run.name == "there":
            run.mkdir()
            (run / "notes.txt").write_text("keep me")
        out = start_train_py(run, bad).communicate(timeout=300)[0]
        assert "trainer.ckpt_every must be an int >= 1, got 0" in out, out[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["there"]
    assert (tmp_path / "there" / "notes.txt").read_text() == "keep me"
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", f"hydra.sweep.dir={sweep}", *bad],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "trainer.ckpt_every must be an int >= 1" in proc.stdout + proc.stderr
    assert os.listdir(sweep) == ["multirun.yaml"]
