"""One training run of the project's Hydra config from Python: the overrides composed as `train.py` composes them,
trained into a folder once (a folder with its summary.json is reused as it is); override lists changed by key."""

import json
import os

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from retention.configs import CONFIG_DIR
from retention.train import train


def with_overrides(base: tuple[str, ...], *changes: str) -> tuple[str, ...]:
    """`base` (Hydra override strings) with each of `changes` applied by key: "key=value" replaces the base's
    entry of that key in place (or is appended when the base has none), "~key" removes it."""
    out = list(base)
    for change in changes:
        key = change.removeprefix("~").split("=", 1)[0]
        at = next((i for i, o in enumerate(out) if o.split("=", 1)[0] == key), None)
        if change.startswith("~"):
            if at is None:
                raise ValueError(f"changes: {change!r} removes {key!r}, which the base does not set")
            del out[at]
        elif at is None:
            out.append(change)
        else:
            out[at] = change
    return tuple(out)


def train_once(folder: str, overrides: list[str]) -> dict:
    """The summary.json of the run in `folder`, trained per `overrides` unless that folder already finished."""
    summary_path = os.path.join(folder, "summary.json")
    if not os.path.exists(summary_path):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = OmegaConf.to_object(compose("config", overrides=overrides))
        train(cfg, folder)
    with open(summary_path) as f:
        return json.load(f)
