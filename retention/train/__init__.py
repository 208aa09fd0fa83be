"""Training: structured configs, AdamW, the compiled step, Orbax checkpoints, TensorBoard metrics, the loop."""

from retention.train.config import (
    Config,
    DataConfig,
    MeshConfig,
    ModelConfig,
    OptimConfig,
    TrainerConfig,
    build,
    register_configs,
)
from retention.train.loop import NonFiniteLoss, train

__all__ = [
    "Config",
    "DataConfig",
    "MeshConfig",
    "ModelConfig",
    "NonFiniteLoss",
    "OptimConfig",
    "TrainerConfig",
    "build",
    "register_configs",
    "train",
]
