"""Checkpoints: a run killed with SIGKILL and restarted ends with the parameters of an uninterrupted run;
SIGTERM saves, then exits; a damaged checkpoint is skipped for the one before; partial saves are ignored."""

import logging
import os
import signal
import threading
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from retention.train import train
from tests.train.common import TINY, compose_config, start_train_py


def fresh_seed() -> int:
    return int(np.random.SeedSequence().generate_state(1)[0] % 2**31)


def saved_steps(run_dir) -> list[int]:
    folder = os.path.join(run_dir, "checkpoints")
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []


def saved_params(run_dir, step: int):
    state = ocp.StandardCheckpointer().restore(os.path.join(run_dir, "checkpoints", str(step), "default"))
    return state["params"]


class Output:
    """Collects a process's output lines in a thread, so waiting for a line cannot block forever."""

    def __init__(self, proc):
        self.lines = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self.thread.start()

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(text in line for line in list(self.lines)):
                return True
            time.sleep(0.05)
        return False

    def text(self) -> str:
        self.thread.join(timeout=10)
        return "".join(self.lines)


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
    a, b = saved_params(whole, 60), saved_params(killed, 60)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


def test_sigterm_saves_then_exits(tmp_path):
    proc = start_train_py(tmp_path, [*TINY, "trainer.steps=100000", "trainer.ckpt_every=100000"])
    out = Output(proc)
    assert out.wait_for("step 3:", timeout=120), out.text()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM, out.text()
    steps = saved_steps(tmp_path)
    assert len(steps) == 1 and steps[0] >= 3, (steps, out.text())
    assert f"saved the checkpoint at step {steps[0]}" in out.text()
    assert not (tmp_path / "summary.json").exists()


def test_damaged_checkpoint_is_skipped(tmp_path, caplog):
    """Truncate every file of the newest checkpoint and leave a partial save behind: the rerun warns, resumes
    from the checkpoint before, and finishes."""
    caplog.set_level(logging.INFO)
    overrides = [*TINY, "trainer.ckpt_every=2", "trainer.keep=5", "trainer.eval_scales=[1]", f"seed={fresh_seed()}"]
    train(compose_config([*overrides, "trainer.steps=4"]), str(tmp_path))
    assert saved_steps(tmp_path) == [2, 4]
    for root, _, files in os.walk(tmp_path / "checkpoints" / "4" / "default"):
        for name in files:
            with open(os.path.join(root, name), "r+b") as f:
                f.truncate(os.path.getsize(os.path.join(root, name)) // 3)
    partial = tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp-1234"
    partial.mkdir()
    (partial / "junk").write_bytes(b"\0" * 10)
    caplog.clear()
    summary = train(compose_config([*overrides, "trainer.steps=6"]), str(tmp_path))
    assert "skipping checkpoint 4" in caplog.text
    assert "resumed from the checkpoint at step 2" in caplog.text
    assert 6 in saved_steps(tmp_path) and np.isfinite(summary["final_loss"])
