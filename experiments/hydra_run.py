"""One training run of the project's Hydra config from Python: the overrides composed as `train.py` composes them,
trained into a folder once (a folder with its summary.json is reused as it is)."""

import json
import os

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from retention.configs import CONFIG_DIR
from retention.train import train


def train_once(folder: str, overrides: list[str]) -> dict:
    """The summary.json of the run in `folder`, trained per `overrides` unless that folder already finished."""
    summary_path = os.path.join(folder, "summary.json")
    if not os.path.exists(summary_path):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = OmegaConf.to_object(compose("config", overrides=overrides))
        train(cfg, folder)
    with open(summary_path) as f:
        return json.load(f)
