"""The trainer's structured configs: typed dataclasses registered in Hydra's ConfigStore, and their value checks.

Hydra merges `configs/` over these schemas, so a misspelt key or a wrong type stops at start-up; `build` then
checks values (lengths, vocab, divisibility) and raises ValueError naming the key, e.g. `data.seq_len`.
"""

import dataclasses
from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from retention.data import TASKS, Dataset
from retention.nn import LMConfig, size_config


@dataclass
class ModelConfig:
    """LMConfig's fields less the vocabulary (the data sets it); `target_params` sizes d_model (size_config)."""

    name: str = "hybrid"
    pattern: str = "PPPA"
    n_layers: int = 4
    d_model: int = 128
    target_params: int | None = None
    n_heads: int = 4
    n_kv_heads: int = 4
    head_dim: int = 32
    mlp_ratio: float = 8 / 3
    deg: int = 2
    window: int = 64
    rope_base: float | None = 10000.0
    tie_embeddings: bool = True
    dtype: str = "float32"
    gating: bool = True
    qk_norm: bool = False
    chunk_size: int | None = None
    impl: str = "auto"


@dataclass
class DataConfig:
    """One task's generator arguments; the fields another task does not use are ignored by it."""

    task: str = "mqar"
    seq_len: int = 64
    batch_size: int = 32
    vocab_size: int = 128  # mqar
    num_kv_pairs: int = 4  # mqar
    power_a: float = 0.01  # mqar
    n_filler: int = 8  # passkey
    depths: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0])  # passkey: eval depths
    num_copy: int = 8  # copy
    n_tokens: int = 16  # copy
    path: str | None = None  # text: a folder (None: the stdlib source)
    eval_fraction: float = 0.05  # text
    prefetch: int = 2


@dataclass
class OptimConfig:
    """AdamW with a warmup-cosine learning rate (to lr * min_lr_ratio) and global-norm clipping."""

    name: str = "adamw"
    lr: float = 3e-3
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    clip_norm: float = 1.0


@dataclass
class TrainerConfig:
    """Steps, logging, evaluation (at seq_len times each of eval_scales), checkpoints and throughput accounting."""

    steps: int = 1000
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    eval_batches: int = 4
    eval_scales: list[int] = field(default_factory=lambda: [1, 4])
    ckpt_every: int = 500
    keep: int = 3
    peak_flops: float = 3e11  # FLOP/s of the machine: the dev machine's measured matmul rate (PERF_LOG.md)
    cache_len: int = 65536  # the length at which the summary reports cache bytes
    progress: bool = True


@dataclass
class MeshConfig:
    """The device mesh (retention/parallel): data x fsdp x sequence must equal the device count of all processes
    (-1 in one axis: the devices the others leave); and, for a multi-host job not started by a scheduler that
    jax.distributed detects (a multi-task Slurm step, mpirun), the coordinator "host:port", process count and rank."""

    data: int = -1
    fsdp: int = 1
    sequence: int = 1
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    seed: int = 0


def register_configs() -> None:
    """Store the schema as `base_config`, which configs/config.yaml extends."""
    ConfigStore.instance().store(name="base_config", node=Config)


def _positive(key: str, value, *, low=1, integer=True) -> None:
    kind = "an int" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or not value >= low:
        raise ValueError(f"{key} must be {kind} >= {low}, got {value!r}")


def _in_range(key: str, value, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"{key} must be in [{low}, {high}], got {value!r}")


def make_dataset(data: DataConfig, seed: int) -> Dataset:
    """The generator for `data.task`; a bad value raises ValueError naming its `data.` key."""
    if data.task not in TASKS:
        raise ValueError(f"data.task must be one of {tuple(TASKS)}, got {data.task!r}")
    names = {
        "mqar": ("vocab_size", "num_kv_pairs", "power_a"),
        "passkey": ("n_filler",),
        "copy": ("num_copy", "n_tokens"),
        "text": ("path", "eval_fraction"),
    }[data.task]
    kwargs = {name: getattr(data, name) for name in ("seq_len", "batch_size", *names)}
    try:
        return TASKS[data.task](**kwargs, seed=seed)
    except ValueError as e:
        raise ValueError(f"data.{e}") from None


def make_lm_config(model: ModelConfig, vocab_size: int) -> LMConfig:
    """The LMConfig of `model` over `vocab_size` ids, d_model chosen by size_config when target_params is set."""
    fields = {f.name for f in dataclasses.fields(LMConfig)}
    kwargs = {k: v for k, v in dataclasses.asdict(model).items() if k in fields}
    try:
        lm = LMConfig(**kwargs, vocab_size=vocab_size)
        if model.target_params is not None:
            _positive("target_params", model.target_params)
            lm = size_config(lm, model.target_params)
    except ValueError as e:
        raise ValueError(f"model.{e}") from None
    return lm


def check_optim_trainer(optim: OptimConfig, trainer: TrainerConfig) -> None:
    """Value checks of the optim and trainer groups (ValueError naming the key)."""
    if optim.name != "adamw":
        raise ValueError(f"optim.name must be 'adamw', got {optim.name!r}")
    for key in ("lr", "eps", "clip_norm"):
        value = getattr(optim, key)
        if not value > 0:
            raise ValueError(f"optim.{key} must be > 0, got {value!r}")
    _positive("optim.weight_decay", optim.weight_decay, low=0, integer=False)
    _in_range("optim.b1", optim.b1, 0, 0.999999)
    _in_range("optim.b2", optim.b2, 0, 0.999999)
    _in_range("optim.min_lr_ratio", optim.min_lr_ratio, 0, 1)
    for key in ("steps", "log_every", "eval_batches", "ckpt_every", "keep", "cache_len"):
        _positive(f"trainer.{key}", getattr(trainer, key))
    _positive("trainer.eval_every", trainer.eval_every, low=0)
    _positive("trainer.peak_flops", trainer.peak_flops, low=1, integer=False)
    if not 0 <= optim.warmup_steps < trainer.steps:
        raise ValueError(f"optim.warmup_steps must be in [0, trainer.steps={trainer.steps}), got {optim.warmup_steps}")
    if not trainer.eval_scales:
        raise ValueError("trainer.eval_scales must list at least one multiple of data.seq_len, got []")
    for scale in trainer.eval_scales:
        _positive("trainer.eval_scales[i]", scale)


def build(cfg: Config) -> tuple[LMConfig, Dataset]:
    """Check every value of `cfg`; returns the model's LMConfig and the data generator."""
    check_optim_trainer(cfg.optim, cfg.trainer)
    _positive("data.prefetch", cfg.data.prefetch)
    dataset = make_dataset(cfg.data, cfg.seed)
    for scale in cfg.trainer.eval_scales:
        dataset.check_length(f"data.seq_len * trainer.eval_scales[i] (scale {scale})", scale * cfg.data.seq_len)
    if cfg.data.task == "passkey":
        for depth in cfg.data.depths:
            _in_range("data.depths[i]", depth, 0, 1)
    return make_lm_config(cfg.model, dataset.vocab_size), dataset
