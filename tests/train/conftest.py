"""A finished tiny run shared by the tests of one process: 4 steps, a checkpoint after every step (each saved
asynchronously, then its buffers donated to the next step), every checkpoint's parameters as read back then. The
tests that use it share one xdist group, so one worker trains it, once, and are marked `integration` (they read a
trainer's run: `make test-integration`)."""

import logging
import shutil

import jax
import numpy as np
import pytest

from retention.train import train
from tests.train.common import TINY, compose_config, fresh_seed, saved_state

RUN = [*TINY, "trainer.steps=4", "trainer.ckpt_every=1", "trainer.keep=10", "trainer.eval_scales=[1]"]


class FinishedRun:
    def __init__(self, folder, overrides):
        self.folder, self.overrides = folder, overrides
        self.summary = train(compose_config(overrides), str(folder))
        self.params = {s: jax.tree.map(np.asarray, saved_state(folder, s)["params"]) for s in range(1, 5)}

    def copy(self, to):
        """A copy of the run folder at `to` (a test may damage or resume it)."""
        shutil.copytree(self.folder, to)
        return to


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    for item in items:
        if "finished_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("finished_run"))
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> FinishedRun:
    logging.getLogger("absl").setLevel(logging.WARNING)
    return FinishedRun(tmp_path_factory.mktemp("finished") / "run", [*RUN, f"seed={fresh_seed()}"])
