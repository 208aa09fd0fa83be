"""Training: structured configs (config), AdamW (optimizer), the compiled steps (step) and evaluation (evaluate), Orbax
checkpoints with per-array checksums (checkpoint; the sums are retention/checksum.py's), the run folder's record and
lock (record, lock), stop signals and preemption (signals), TensorBoard and HParams (metrics, hparams), the
loss-by-position plot (position_plot), the loop (loop, progress) and its convergence rule (convergence). The
trainer's libraries (Optax, Orbax, Hydra, tensorboardX, matplotlib, ...) come with the `train` extra."""

try:
    from retention.train.config import (
        DATA_SCHEMAS,
        Config,
        DataConfig,
        EarlyStopConfig,
        MeshConfig,
        ModelConfig,
        OptimConfig,
        TrainerConfig,
        build,
        make_lm_config,
        register_configs,
    )
    from retention.train.loop import NonFiniteLoss, train
except ModuleNotFoundError as missing:  # a library of the `train` extra: name the extra that installs it
    if (missing.name or "").split(".")[0] == "retention":
        raise
    raise ModuleNotFoundError(
        f"retention.train needs {missing.name!r}, one of the trainer's libraries: pip install 'retention-jax[train]'",
        name=missing.name,
    ) from missing

__all__ = [
    "DATA_SCHEMAS",
    "Config",
    "DataConfig",
    "EarlyStopConfig",
    "MeshConfig",
    "ModelConfig",
    "NonFiniteLoss",
    "OptimConfig",
    "TrainerConfig",
    "build",
    "make_lm_config",
    "register_configs",
    "train",
]
