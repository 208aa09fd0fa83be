"""The Hydra entry point, installed as the console script `retention-train` (and run by the repository's
`python train.py`): `retention-train model=hybrid data=mqar data.seq_len=256`, or a sweep with
`retention-train -m model=softmax,power,hybrid`. Configs: retention/configs/ (package data), typed by
retention/train/config.py. Each run trains in its Hydra run folder, under the working directory unless
hydra.run.dir says otherwise (run.json, Orbax checkpoints in checkpoints/, TensorBoard events in tb/, summary.json,
train.log) and resumes from its newest checkpoint when rerun with the same folder (hydra.run.dir=...). Its .hydra/
(config.yaml, hydra.yaml, overrides.yaml) is written only once the run holds the folder and is the folder's run.
"""

import logging

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from retention.train.config import register_configs
from retention.train.hparams import override_hparams
from retention.train.loop import train

register_configs()
logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every save at INFO


# config_path is relative to this file: Hydra finds CONFIG_DIR as the package resource retention/configs.
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
