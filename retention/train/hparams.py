"""What TensorBoard's HParams tab shows for a run: every architecture field, the keys that identify its recipe, the
absolute eval lengths, what its command line set (a sweep's varied keys among them), and the scalar tags shown as
metrics."""

import dataclasses

from omegaconf import DictConfig, OmegaConf

from retention.nn import LMConfig
from retention.train.config import Config

EVAL_METRICS = ("loss", "accuracy", "exact_match")  # of each eval scale, as HParams metrics
TEXT_EVAL_METRICS = ("bits_per_byte",)  # and of a text run's


def cache_tag(cache_len: int) -> str:
    """The scalar tag of one sequence's decode-cache bytes at trainer.cache_len tokens."""
    return f"model/cache_bytes/{cache_len}"


def architecture_hparams(lm: LMConfig) -> dict:
    """Every field of the model as `model.<field>` (vocab_size, set by the data, as `vocab_size`) and each
    per-layer setting as `model.layers.<letter>.<field>`; None as "none", since HParams holds scalars."""
    fields = {
        f"model.{f.name}": getattr(lm, f.name) for f in dataclasses.fields(lm) if f.name not in ("vocab_size", "layers")
    }
    for letter, settings in lm.layers.items():
        fields |= {f"model.layers.{letter}.{key}": value for key, value in settings.items()}
    return {key: "none" if value is None else value for key, value in fields.items()}


def run_hparams(cfg: Config, lm: LMConfig, n_params: int, overrides: dict | None = None) -> dict:
    """The identifying hyperparameters of a run, then `overrides` (see `override_hparams`)."""
    T = cfg.data.seq_len
    keys = {
        "model.name": cfg.model.name,
        "layer_kinds": lm.layer_kinds,
        "params": n_params,
        **architecture_hparams(lm),
        "data.task": cfg.data.task,
        "data.seq_len": T,
        "data.batch_size": cfg.data.batch_size,
        **({"data.tokenizer": cfg.data.tokenizer} if cfg.data.task == "text" else {}),
        "vocab_size": lm.vocab_size,
        "optim.lr": cfg.optim.lr,
        "optim.weight_decay": cfg.optim.weight_decay,
        "optim.warmup_steps": cfg.optim.warmup_steps,
        "optim.accumulate": cfg.optim.accumulate,
        "trainer.steps": cfg.trainer.steps,
        "trainer.early_stop.patience": cfg.trainer.early_stop.patience,
        "seed": cfg.seed,
    }
    lengths = {f"eval_len.x{s}": s * T for s in cfg.trainer.eval_scales}
    return {**keys, **lengths, **(overrides or {})}


def metric_tags(cfg: Config) -> list[str]:
    """The scalar tags shown as HParams metrics: final eval values per scale, train loss, tokens/s, cache bytes."""
    names = EVAL_METRICS + (TEXT_EVAL_METRICS if cfg.data.task == "text" else ())
    evals = [f"eval/x{s}/{name}" for s in cfg.trainer.eval_scales for name in names]
    return [*evals, "train/loss", "perf/tokens_per_s", cache_tag(cfg.trainer.cache_len)]


def override_hparams(overrides: list[str], choices: dict, cfg: DictConfig) -> dict:
    """{key: value} for each command-line override (`hydra.overrides.task`, e.g. model=power, data.seq_len=512):
    a config group's chosen option, or the key's resolved value; hydra.* keys are left out."""
    out = {}
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key.startswith("hydra"):  # hydra.run.dir=..., hydra/launcher=...
            continue
        value = choices[key] if key in choices else OmegaConf.select(cfg, key)
        out[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out
