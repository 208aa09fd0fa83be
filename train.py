"""The Hydra entry point: `python train.py model=hybrid data=mqar data.seq_len=256`, or a sweep with
`python train.py -m model=softmax,power,hybrid`. Each run trains in its Hydra run folder (run.json, Orbax
checkpoints in checkpoints/, TensorBoard events in tb/, summary.json) and resumes from its newest checkpoint when
rerun with the same folder (hydra.run.dir=...). Its .hydra/ (config.yaml, hydra.yaml, overrides.yaml) is
written only once the run holds the folder and is the folder's run. Configs: configs/, typed by
retention/train/config.py.
"""

import logging

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from retention.train import register_configs, train
from retention.train.hparams import override_hparams

register_configs()
logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every save at INFO


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Train one run; returns its final loss (what a Hydra sweeper would minimise). The command line's overrides
    (a sweep's varied keys) become HParams keys of the run."""
    hydra_cfg = HydraConfig.get()
    overrides = override_hparams(list(hydra_cfg.overrides.task), dict(hydra_cfg.runtime.choices), cfg)
    hydra_files = {  # what Hydra writes in .hydra/ (configs/config.yaml turns that off): written once the run starts
        ".hydra/config.yaml": OmegaConf.to_yaml(cfg),
        ".hydra/hydra.yaml": OmegaConf.to_yaml(HydraConfig.instance().cfg),
        ".hydra/overrides.yaml": OmegaConf.to_yaml(hydra_cfg.overrides.task),
    }
    run_dir = hydra_cfg.runtime.output_dir
    summary = train(OmegaConf.to_object(cfg), run_dir, hparams=overrides, files=hydra_files)
    return summary["final_loss"]


if __name__ == "__main__":
    main()
