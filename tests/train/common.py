"""Shared by the trainer tests: a tiny config (2 layers, 16 tokens) composed through Hydra, train.py runs, and
readers of what a run folder holds (checkpoints, TensorBoard events)."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import orbax.checkpoint as ocp
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from retention.configs import CONFIG_DIR
from retention.train import Config, register_configs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_MODEL = [  # the tests' smallest model of any pattern: its sizes, after the model group
    "model.target_params=null",
    "model.n_layers=2",
    "model.d_model=16",
    "model.n_heads=2",
    "model.n_kv_heads=2",
    "model.head_dim=8",
    "model.chunk_size=16",
]
TINY = [
    "model=hybrid",
    "model.pattern=PA",
    *TINY_MODEL,
    "data.seq_len=16",
    "data.batch_size=4",
    "data.vocab_size=24",
    "data.num_kv_pairs=2",
    "optim.warmup_steps=1",
    "optim.lr=1e-2",
    "trainer.log_every=1",
    "trainer.eval_batches=1",
    "trainer.eval_scales=[1,2]",
    "trainer.progress=false",
    "trainer.cache_len=1024",
]


def compose_config(overrides: list[str]) -> Config:
    """The typed Config that `python train.py <overrides>` would run."""
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return OmegaConf.to_object(compose("config", overrides=overrides))


def start_train_py(run_dir, overrides: list[str], env: dict | None = None, shell: str = "") -> subprocess.Popen:
    """`python train.py` with the overrides in `run_dir` (and more environment variables `env`; `shell`: bash
    commands run before it in the same process, e.g. `ulimit`), stdout and stderr merged into one text pipe."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", **(env or {})}
    command = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *overrides]
    return subprocess.Popen(
        ["bash", "-c", f'{shell}\nexec "$@"', "bash", *command] if shell else command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def fresh_seed() -> int:
    """A new seed each call, so the runs of a test differ from run to run."""
    return int(np.random.SeedSequence().generate_state(1)[0] % 2**31)


def saved_steps(run_dir) -> list[int]:
    """The checkpoint steps listed in a run folder."""
    folder = os.path.join(run_dir, "checkpoints")
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []


def saved_state(run_dir, step: int):
    """Checkpoint `step` of a run folder, read by Orbax alone (no checksum check)."""
    return ocp.StandardCheckpointer().restore(os.path.join(run_dir, "checkpoints", str(step), "state"))


def event_files(logdir) -> list[str]:
    """Every TensorBoard event file under `logdir`, at any depth."""
    return [os.path.join(r, f) for r, _, fs in os.walk(logdir) for f in fs if f.startswith("events.out")]


def event_tags(logdir) -> set[str]:
    """The scalar tags of the TensorBoard run in `logdir`."""
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    return set(events.Tags()["scalars"])


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
