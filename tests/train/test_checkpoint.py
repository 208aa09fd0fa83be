"""Checkpoints never lose a result: a run killed with SIGKILL and restarted ends with the parameters of an
uninterrupted run; SIGTERM and SIGUSR2 save, then exit; a damaged checkpoint (data cut short, its item folder
gone, its metadata cut short) is moved aside, the run goes on from the one before and writes it again, equal to
the lost one bit for bit (that one was saved asynchronously before the next step donated its buffers); a
flipped bit in a checkpoint's data is caught by its checksums or changes nothing."""

import json
import logging
import os
import re
import signal
import socket
import time

import jax
import numpy as np
import pytest

from retention.train import build, train
from retention.train.checkpoint import Checkpoints
from retention.train.optimizer import make_optimizer
from retention.train.signals import StopSignals
from retention.train.step import make_init
from tests.train.common import (
    TINY,
    Output,
    compose_config,
    fresh_seed,
    saved_state,
    saved_steps,
    start_train_py,
)


def assert_same_params(a, b):
    """Bitwise equal leaves (an nnx.State and Orbax's plain dicts of it flatten in the same order)."""
    a, b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.integration
def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    overrides = [*TINY, "trainer.steps=60", "trainer.ckpt_every=10", "trainer.keep=10", f"seed={fresh_seed()}"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    p_whole, p_killed = start_train_py(whole, overrides), start_train_py(killed, overrides)
    out_whole, out_killed = Output(p_whole), Output(p_killed)
    deadline = time.time() + 120
    while not [s for s in saved_steps(killed) if s >= 20] and time.time() < deadline and p_killed.poll() is None:
        time.sleep(0.02)
    p_killed.send_signal(signal.SIGKILL)
    assert p_killed.wait(timeout=30) == -signal.SIGKILL, out_killed.text()
    kept = saved_steps(killed)
    assert kept and max(kept) < 60, kept  # killed mid-run

    p_resumed = start_train_py(killed, overrides)
    out_resumed = Output(p_resumed)
    assert p_resumed.wait(timeout=180) == 0, out_resumed.text()
    assert f"resumed from the checkpoint at step {max(kept)}" in out_resumed.text()
    assert p_whole.wait(timeout=180) == 0, out_whole.text()
    assert_same_params(saved_state(whole, 60)["params"], saved_state(killed, 60)["params"])


@pytest.mark.slow  # further cases: test_run_folder's second-run test stops its first run with SIGTERM, as here
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2])
def test_stop_signal_saves_then_exits(tmp_path, signum):
    proc = start_train_py(tmp_path, [*TINY, "trainer.steps=100000", "trainer.ckpt_every=100000"])
    out = Output(proc)
    assert out.wait_for("step 3:", timeout=120), out.text()
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == 128 + signum, out.text()
    steps = saved_steps(tmp_path)
    assert len(steps) == 1 and steps[0] >= 3, (steps, out.text())
    assert f"saved the checkpoint at step {steps[0]}" in out.text()
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.integration
def test_two_processes_agree_on_the_step_to_save(tmp_path):
    """A two-process job (CPU, gloo): SIGTERM to process 0 alone reaches process 1 through JAX's preemption
    service; both save the same step (Orbax's preemption sync point) and exit."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    job = [*TINY, "trainer.steps=100000", "trainer.ckpt_every=100000", "trainer.log_every=20"]
    job += [f"mesh.coordinator_address=localhost:{port}", "mesh.num_processes=2"]
    env = {"JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
    procs = [start_train_py(tmp_path, [*job, f"mesh.process_id={i}"], env) for i in range(2)]
    outs = [Output(p) for p in procs]
    try:
        assert outs[0].wait_for("step 20:", timeout=180), outs[0].text()
        procs[0].send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [128 + signal.SIGTERM] * 2, [o.text()[-3000:] for o in outs]
    (step,) = saved_steps(tmp_path)
    for out in outs:
        assert f"saved the checkpoint at step {step}" in out.text()


def test_stop_signals_record_then_hand_on():
    """Each signal is only recorded; exit() calls the handler that was there before (submitit's USR2 handler
    requeues the job), except Python's KeyboardInterrupt one, then exits with 128 + the signal."""
    called = []
    sigint = signal.getsignal(signal.SIGINT)  # Python's KeyboardInterrupt one, or SIG_IGN in an xdist worker
    before = signal.signal(signal.SIGUSR2, lambda s, f: called.append(s))
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            with pytest.raises(SystemExit) as info, StopSignals() as stop:
                os.kill(os.getpid(), signum)
                assert stop.signum == signum
                stop.exit()
            assert info.value.code == 128 + signum
        assert called == [signal.SIGUSR2]
        assert signal.getsignal(signal.SIGINT) is sigint  # handlers restored
    finally:
        signal.signal(signal.SIGUSR2, before)


def _truncate_data(step_dir):
    for root, _, files in os.walk(step_dir / "state"):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 3)


def _remove_item(step_dir):
    for root, dirs, files in os.walk(step_dir / "state", topdown=False):
        for name in files:
            os.remove(os.path.join(root, name))
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    os.rmdir(step_dir / "state")


def _truncate_metadata(step_dir):
    with open(step_dir / "_CHECKPOINT_METADATA", "r+b") as f:
        f.truncate(40)


@pytest.mark.parametrize(
    "damage", [*(pytest.param(d, marks=pytest.mark.slow) for d in (_truncate_data, _remove_item)), _truncate_metadata]
)
def test_damaged_newest_checkpoint_is_set_aside_and_rewritten(finished_run, tmp_path, caplog, damage):
    run = finished_run.copy(tmp_path / "run")
    damage(run / "checkpoints" / "4")
    (run / "checkpoints" / "5.orbax-checkpoint-tmp-1234").mkdir()  # and a save cut short
    caplog.set_level(logging.INFO)
    summary = train(compose_config(finished_run.overrides), str(run))
    assert "checkpoint 4 in" in caplog.text and "is damaged" in caplog.text
    assert "resumed from the checkpoint at step 3" in caplog.text  # the manager still reads the others
    (aside,) = os.listdir(run / "checkpoints_damaged")  # kept, not deleted
    assert aside.startswith("4_") and os.listdir(run / "checkpoints_damaged" / aside)
    assert saved_steps(run) == [1, 2, 3, 4] and summary["final_loss"] == finished_run.summary["final_loss"]
    assert_same_params(saved_state(run, 4)["params"], finished_run.params[4])  # step 4 written again, exactly
    caplog.clear()
    train(compose_config(finished_run.overrides), str(run))  # the next rerun starts from the new step 4
    assert "resumed from the checkpoint at step 4" in caplog.text and "is damaged" not in caplog.text


def test_every_checkpoint_damaged_says_the_run_starts_over(finished_run, tmp_path, caplog):
    run = finished_run.copy(tmp_path / "run")
    for step in saved_steps(run):
        _truncate_data(run / "checkpoints" / str(step))
    caplog.set_level(logging.INFO)
    summary = train(compose_config(finished_run.overrides), str(run))
    assert re.search(
        r"every checkpoint in .*checkpoints \(steps \[1, 2, 3, 4\]\) is damaged .*starts over from step 0", caplog.text
    )
    (entry,) = json.load(open(run / "run.json"))["started_over"]
    assert entry["damaged_steps"] == [1, 2, 3, 4] and summary["started_over"] == [entry]
    assert summary["resumed_from"] == 0 and sorted(os.listdir(run / "checkpoints_damaged"))[0].startswith("1_")
    assert summary["final_loss"] == finished_run.summary["final_loss"]  # the same run, trained again from 0
    caplog.clear()
    train(compose_config(finished_run.overrides), str(run))  # a later resume keeps the history
    assert json.load(open(run / "run.json"))["started_over"] == [entry] and "starts over" not in caplog.text


def test_flipped_bits_are_caught_or_harmless(finished_run, tmp_path, caplog):
    """Flip one random bit in a data file of checkpoint 4: restoring gives checkpoint 3 (4 was caught and moved
    aside) or checkpoint 4 with every array as saved, never other values (Orbax alone loads most such flips as
    good, with values up to 3e38)."""
    cfg = compose_config(finished_run.overrides)
    lm, _ = build(cfg)
    abstract = jax.eval_shape(make_init(lm, make_optimizer(cfg.optim, cfg.trainer.steps)[0], cfg.seed))
    rng = np.random.default_rng(fresh_seed())
    caught = 0
    for trial in range(12):
        run = finished_run.copy(tmp_path / str(trial))
        data = run / "checkpoints" / "4" / "state" / "d"  # the OCDBT data files a restore reads
        path = str(data / rng.choice(os.listdir(data)))
        raw = bytearray(open(path, "rb").read())
        raw[rng.integers(len(raw))] ^= 1 << int(rng.integers(8))
        open(path, "wb").write(bytes(raw))
        ckpt = Checkpoints(str(run / "checkpoints"))
        restored = ckpt.restore_latest(abstract)
        ckpt.close()
        if restored.step == 3:
            caught += 1
            assert_same_params(restored.state["params"], finished_run.params[3])
        else:
            assert restored.step == 4
            assert_same_params(restored.state["params"], finished_run.params[4])
    assert caught > 0
