"""Training: structured configs, AdamW, the compiled step, Orbax checkpoints, TensorBoard metrics, the loop."""

from retention.train.config import (
    DATA_SCHEMAS,
    Config,
    CopyDataConfig,
    DataConfig,
    MeshConfig,
    ModelConfig,
    MQARDataConfig,
    OptimConfig,
    PasskeyDataConfig,
    TextDataConfig,
    TrainerConfig,
    build,
    make_lm_config,
    register_configs,
)
from retention.train.loop import NonFiniteLoss, train

__all__ = [
    "DATA_SCHEMAS",
    "Config",
    "CopyDataConfig",
    "DataConfig",
    "MQARDataConfig",
    "MeshConfig",
    "ModelConfig",
    "NonFiniteLoss",
    "OptimConfig",
    "PasskeyDataConfig",
    "TextDataConfig",
    "TrainerConfig",
    "build",
    "make_lm_config",
    "register_configs",
    "train",
]
