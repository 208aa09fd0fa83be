"""A save that fails (a read-only checkpoints/ folder, a full disk) stops train.py at once with a non-zero exit
and a message naming the checkpoint folder: the process never hangs on Orbax's background threads."""

import os
import re
import shutil
import subprocess

import pytest

from tests.train.common import TINY, start_train_py

RUN = [*TINY, "trainer.steps=3", "trainer.ckpt_every=2", "trainer.eval_scales=[1]"]
LIMIT_S = 180  # far beyond a tiny run's time: a process still running then is hung


def finish(proc) -> tuple[int, str]:
    """(exit code, output) of a train.py process; fails the test when it has not ended within LIMIT_S."""
    try:
        out, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"train.py hung after a failed save:\n{out[-3000:]}")
    return proc.returncode, out


def make_read_only(folder) -> None:
    """Deny every write into `folder`, for root too (the immutable attribute), else by its mode."""
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        return
    if os.geteuid() == 0:
        pytest.skip("running as root on a file system without chattr +i: no folder is read-only for root")
    os.chmod(folder, 0o555)


@pytest.mark.integration
@pytest.mark.slow  # a further case of a failed save (a full disk: the quick one)
def test_a_read_only_checkpoint_folder_stops_the_run(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    make_read_only(run / "checkpoints")
    try:
        code, out = finish(start_train_py(run, RUN))
    finally:
        subprocess.run(["chattr", "-i", str(run / "checkpoints")], capture_output=True)
        os.chmod(run / "checkpoints", 0o755)
    assert code != 0, out[-3000:]
    assert f"could not save checkpoint 2 in {run / 'checkpoints'}" in out, out[-3000:]
    assert not (run / "summary.json").exists()


SMALL_FILES = "ulimit -f 16 && trap '' XFSZ"  # files over 16 KiB cannot be written: EFBIG, as ENOSPC on a full disk


@pytest.mark.integration
def test_a_full_disk_stops_the_run(tmp_path):
    """The checkpoint's array files exceed the limit; run.json, the log and the events do not."""
    run = tmp_path / "run"
    proc = start_train_py(run, RUN, shell=SMALL_FILES)
    code, out = finish(proc)
    assert code != 0, out[-3000:]
    said = re.search(rf"could not (save checkpoint \d+|finish writing a checkpoint) in {run / 'checkpoints'}: .*", out)
    assert said and "File too large" in said.group(), out[-3000:]
    assert not (run / "summary.json").exists()
