"""The compared entries as trainer configs: Hydra composes the packaged configs (configs/) with an entry's
model group, its task's experiment file (experiment/compare/<cell>.yaml) and its overrides, exactly as `train.py`
would, and an entry with `matched_window` gets the window whose KV cache holds the
bytes of the power model's decode state on that task (the same layers, heads, head dim and parts).
"""

from functools import cache
from pathlib import Path

from flax import nnx
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.cache_memory import sequence_cache_bytes
from experiments.compare.presets import Preset
from retention.configs import CONFIG_DIR
from retention.nn import LM
from retention.train import register_configs
from retention.train.config import Config, make_lm_config

register_configs()


def compose_config(overrides: list[str]) -> Config:
    """The typed trainer Config of configs/config.yaml with `overrides` (Hydra's override syntax)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=list(overrides)))


def config_yaml(cfg: Config) -> str:
    """The resolved config as YAML (what each run folder keeps beside its results)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def resolved_model(cfg: Config) -> dict:
    """The model section of a trainer Config with every default filled in (what a run folder's config.yaml keeps):
    the recipe a run trained with, comparable across runs."""
    return OmegaConf.to_container(OmegaConf.structured(cfg).model)


def model_section(config_yaml_path: Path) -> dict | None:
    """The model section of a run folder's resolved config.yaml (`config_yaml`), or None when it has none."""
    if not config_yaml_path.is_file():
        return None
    return OmegaConf.to_container(OmegaConf.load(config_yaml_path).model)


def lm_cache_bytes(cfg: Config, length: int, state_format=None) -> int:
    """Decode-cache bytes of one sequence for cfg's model (shapes only, nothing allocated; the caches do not depend
    on the vocabulary).

    Args:
        cfg: a trainer Config (its model section).
        length: tokens the caches hold.
        state_format: None (float32 states) or one of retention.serve's STATE_FORMATS: the states as
            `quantize_caches` stores them (see `sequence_cache_bytes`).

    Returns:
        The bytes of every array of the caches.
    """
    model = nnx.eval_shape(lambda: LM(make_lm_config(cfg.model, 256), rngs=nnx.Rngs(0)))
    return sequence_cache_bytes(model, length, state_format)


@cache
def _matched_window(experiment: str) -> int:
    power = compose_config(["model=power", f"experiment={experiment}"])
    softmax = compose_config(["model=softmax", f"experiment={experiment}"])
    per_token = lm_cache_bytes(softmax, 2) - lm_cache_bytes(softmax, 1)
    fixed = lm_cache_bytes(softmax, 1) - per_token  # what does not grow: a convolution's inputs, the length
    return (lm_cache_bytes(power, 1) - fixed) // per_token


def cell(preset: Preset, task: str | None = None) -> str:
    """The experiment config of `task`'s runs (None: the preset's model block, as the speed sweep runs it)."""
    return preset.model if task is None else preset.tasks[task].experiment


def matched_window(preset: Preset, task: str | None = None) -> int:
    """The sliding window (tokens) whose KV cache has the bytes of the power model's state, rounded down, for the
    models of `task` (None: the preset's model block, as the speed sweep runs it)."""
    return _matched_window(cell(preset, task))


def entry_overrides(name: str, preset: Preset, task: str | None = None) -> list[str]:
    """The overrides of entry `name` on `task` (None: the speed sweep's models): its model group, the task's
    experiment (the preset's model block with the task's data, optimiser and trainer; None: the preset's model
    block alone), the entry's own overrides, and for a matched window its window."""
    if name not in preset.entries:
        raise ValueError(f"entry must be one of {tuple(preset.entries)}, got {name!r}")
    entry = preset.entries[name]
    if not entry.trained:  # the base's model; a quantized KV cache is a model setting, a state format is not
        bits = [f"model.kv_cache_bits={entry.kv_cache_bits}"] if entry.kv_cache_bits is not None else []
        return [*entry_overrides(entry.base, preset, task), *bits, f"model.name={name}"]
    window = [f"model.window={matched_window(preset, task)}"] if entry.matched_window else []
    return [f"model={entry.group}", f"experiment={cell(preset, task)}", *entry.overrides, f"model.name={name}", *window]
