"""Training: structured configs (config), AdamW (optimizer), the compiled steps (step) and evaluation (evaluate),
Orbax checkpoints with per-array checksums (checkpoint, checksum), the run folder's record and lock (record,
lock), stop signals and preemption (signals), TensorBoard and HParams (metrics, hparams), the loop (loop,
progress) and its convergence rule (convergence)."""

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
