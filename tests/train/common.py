"""Shared by the trainer tests: a tiny config (2 layers, 16 tokens) composed through Hydra, and train.py runs."""

import os
import subprocess
import sys

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from retention.train import Config, register_configs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
    "model=hybrid",
    "model.pattern=PA",
    "model.target_params=null",
    "model.n_layers=2",
    "model.d_model=16",
    "model.n_heads=2",
    "model.n_kv_heads=2",
    "model.head_dim=8",
    "model.chunk_size=16",
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
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        return OmegaConf.to_object(compose("config", overrides=overrides))


def start_train_py(run_dir, overrides: list[str]) -> subprocess.Popen:
    """`python train.py` with the overrides in `run_dir`, stdout and stderr merged into one text pipe."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *overrides],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
