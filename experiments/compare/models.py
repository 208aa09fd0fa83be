"""The compared models as trainer configs: Hydra composes `configs/` with a preset's overrides, exactly as
`train.py` would, and `swa_matched` gets the window whose KV cache holds the bytes of the power model's state.
"""

from pathlib import Path

from flax import nnx
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.cache_memory import sequence_cache_bytes
from experiments.compare.presets import MODELS, Preset
from retention.nn import LM
from retention.train import register_configs
from retention.train.config import Config, make_lm_config

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")
register_configs()


def compose_config(overrides: list[str]) -> Config:
    """The typed trainer Config of configs/config.yaml with `overrides` (Hydra's override syntax)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=overrides))


def lm_cache_bytes(cfg: Config, length: int, vocab_size: int = 256) -> int:
    """Decode-cache bytes of one sequence at `length` tokens for cfg's model (shapes only, nothing allocated)."""
    model = nnx.eval_shape(lambda: LM(make_lm_config(cfg.model, vocab_size), rngs=nnx.Rngs(0)))
    return sequence_cache_bytes(model, length)


def matched_window(preset: Preset) -> int:
    """The sliding window (tokens) whose KV cache has the bytes of the power model's state (its conv cache
    included), rounded down: the KV cache's bytes per token and its fixed bytes (slot counters) from the softmax
    model's cache at lengths 1 and 2."""
    power = compose_config(["model=power", *preset.model])
    softmax = compose_config(["model=softmax", *preset.model])
    state = lm_cache_bytes(power, 1)
    per_token = lm_cache_bytes(softmax, 2) - lm_cache_bytes(softmax, 1)
    fixed = lm_cache_bytes(softmax, 1) - per_token
    return (state - fixed) // per_token


def model_overrides(name: str, preset: Preset, window: int) -> list[str]:
    """Overrides that select model `name` of the preset (`window`: swa_matched's, from matched_window)."""
    if name not in MODELS:
        raise ValueError(f"model must be one of {tuple(MODELS)}, got {name!r}")
    extra = [f"model.name={name}", f"model.window={window}"] if name == "swa_matched" else []
    return [f"model={MODELS[name]}", *preset.model, *extra]
