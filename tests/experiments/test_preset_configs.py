"""The comparison's composed configs are frozen: every preset's every (task, entry) run (its first lr and seed)
and every speed model composes to the config in preset_configs.json, so moving a recipe between files (the
experiment/compare/ YAML, presets.py) cannot change a run. A recipe changed on purpose rewrites the fixture:
`python -m tests.experiments.test_preset_configs`, and the diff shows what moved."""

import functools
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from experiments.compare.models import compose_config, entry_overrides
from experiments.compare.presets import PRESETS
from experiments.compare.protocol import Run
from experiments.compare.quality import run_overrides

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration

FIXTURE = Path(__file__).with_name("preset_configs.json")


def flat(tree: dict, prefix: str = "") -> dict:
    """{dotted key: leaf value} of a nested dict (a list is a leaf)."""
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


@functools.cache
def flat_config(overrides: tuple[str, ...]) -> dict:
    return flat(OmegaConf.to_container(OmegaConf.structured(compose_config(list(overrides)))))


def as_dict(overrides: list[str]) -> dict:
    """The composed config's keys whose values differ from the trainer's defaults (config.yaml alone), and the
    keys the defaults have that it lacks (as None: a model group's own keys)."""
    default, composed = flat_config(()), flat_config(tuple(overrides))
    return {k: composed.get(k) for k in {*default, *composed} if composed.get(k, KeyError) != default.get(k, KeyError)}


def preset_configs(preset) -> dict:
    """{"<task>/<entry>": config of its first run, "speed/<model>": the speed sweep's config} of `preset`."""
    out = {}
    for task, spec in preset.tasks.items():
        for entry in preset.task_entries(task):
            out[f"{task}/{entry}"] = as_dict(run_overrides(preset, Run(task, entry, spec.lrs[0], spec.seeds[0])))
    for model in preset.speed.models if preset.speed else ():
        out[f"speed/{model}"] = as_dict(entry_overrides(model, preset))
    return out


@pytest.mark.xdist_group("preset_configs")
@pytest.mark.parametrize("name", PRESETS)
def test_every_run_composes_its_frozen_config(name):
    frozen = json.loads(FIXTURE.read_text())[name]
    assert preset_configs(PRESETS[name]) == frozen


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps({n: preset_configs(p) for n, p in PRESETS.items()}, indent=1, sort_keys=True) + "\n")
