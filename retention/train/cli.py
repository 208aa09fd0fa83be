"""The Hydra entry point, installed as the console script `retention-train` (and run by the repository's
`python train.py`): `retention-train model=hybrid data=mqar data.seq_len=256`, or a sweep with
`retention-train -m model=softmax,power,hybrid`. Configs: configs/ (package data), typed by
retention/train/config.py. Each run trains in its Hydra run folder, under the working directory unless hydra.run.dir
says otherwise (run.json, Orbax checkpoints in checkpoints/, TensorBoard events in tb/, summary.json, a text run's
loss_by_position.png, train.log) and resumes from its newest checkpoint when rerun with the same folder
(hydra.run.dir=...). Its .hydra/ (config.yaml, hydra.yaml, overrides.yaml) is written only once the run holds the folder
and is the folder's run. A start refused before its run begins (run.json not written: a bad config value, say) removes
the run folder Hydra made for it, and the empty folders above it that it made (`RemoveRefusedStart`, a Hydra callback
the config installs); a folder that was there before is never removed.
"""

import logging
import os
import shutil

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from retention.train.config import register_configs
from retention.train.hparams import override_hparams
from retention.train.lock import RunFolderBusy, RunLock
from retention.train.loop import train
from retention.train.record import RECORD_FILE

register_configs()
logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every save at INFO


# config_path is relative to this file's package: Hydra finds CONFIG_DIR as the package retention.configs (the
# repository's top-level configs/, installed there by pyproject.toml's package-dir).
@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Train one run; returns its final loss (what a Hydra sweeper would minimise). The command line's overrides
    (a sweep's varied keys) become HParams keys of the run."""
    hydra_cfg = HydraConfig.get()
    overrides = override_hparams(list(hydra_cfg.overrides.task), dict(hydra_cfg.runtime.choices), cfg)
    hydra_files = {  # what Hydra writes in .hydra/ (config.yaml turns that off): written once the run starts
        ".hydra/config.yaml": OmegaConf.to_yaml(cfg),
        ".hydra/hydra.yaml": OmegaConf.to_yaml(HydraConfig.instance().cfg),
        ".hydra/overrides.yaml": OmegaConf.to_yaml(hydra_cfg.overrides.task),
    }
    run_dir = hydra_cfg.runtime.output_dir
    summary = train(OmegaConf.to_object(cfg), run_dir, hparams=overrides, files=hydra_files)
    return summary["final_loss"]


def _resolved_folder(config: DictConfig, key: str) -> str:
    """The absolute folder that the Hydra config `config` names at `key` (hydra.run.dir, hydra.sweep.dir), resolved
    as Hydra's run_job resolves it next (the same config object, so the same ${now:...})."""
    HydraConfig.instance().set_config(config)  # the ${hydra:...} resolver reads it; run_job sets it again
    return os.path.abspath(str(OmegaConf.select(config, key)))


def _missing(folder: str) -> list[str]:
    """`folder` and its ancestors that do not exist yet, deepest first."""
    out = []
    while not os.path.exists(folder):
        out.append(folder)
        folder = os.path.dirname(folder)
    return out


class RemoveRefusedStart(Callback):
    """Hydra callback: a job that fails before its run begins (no run.json in its folder) removes its run folder
    when this start made it, and the empty folders above it it made. What was there before the start is kept,
    and so is a folder another process holds the run lock of. A sweep's folder keeps its multirun.yaml."""

    def __init__(self):
        self.made: list[str] = []  # the folders a run would make (deepest first), found before Hydra makes them
        self.sweep: tuple[str, set[str]] | None = None  # a sweep's folder and what it held before the sweep

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        self.made = _missing(_resolved_folder(config, "hydra.run.dir"))

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep = _resolved_folder(config, "hydra.sweep.dir")
        self.sweep = sweep, set(os.listdir(sweep)) if os.path.isdir(sweep) else set()

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        run_dir = os.path.abspath(config.hydra.runtime.output_dir)
        made = self.made if self.made[:1] == [run_dir] else []
        if self.sweep is not None and os.path.dirname(run_dir) == self.sweep[0]:
            made = [] if os.path.basename(run_dir) in self.sweep[1] else [run_dir]
        if job_return.status != JobStatus.FAILED or not made or os.path.exists(os.path.join(run_dir, RECORD_FILE)):
            return
        try:
            with RunLock(run_dir):  # nobody trains here (a process that took the folder meanwhile keeps it)
                shutil.rmtree(run_dir)
        except (RunFolderBusy, ValueError, OSError):  # busy, a lock that is a link, or not removable: kept
            return
        for folder in made[1:]:
            try:
                os.rmdir(folder)  # only when empty
            except OSError:
                return
