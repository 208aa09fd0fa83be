"""The trainer's structured configs: typed dataclasses registered in Hydra's ConfigStore, and their value checks.

Hydra merges the packaged configs (configs/) over these schemas, so a misspelt key or a
wrong type stops at start-up; `build` then checks values (lengths, vocab, divisibility) and raises ValueError
naming the key, e.g. `data.seq_len`.

- `model`: `ModelConfig`, made from `LMConfig`'s fields (a field added there is a `model.` key at once, with its
  default) less `vocab_size`, which the data sets, plus `name` and `target_params`.
- `data`: one schema per task (`DATA_SCHEMAS[task]`), made from its generator's keyword arguments and defaults
  (the generator owns them) plus the shared `seq_len`, `batch_size` and `prefetch`; the task is the
  chosen group (`data=passkey`), so a key of another task stops at composition.
- `optim`, `trainer`, `mesh` (a config group too: `mesh=fsdp`, `mesh.sequence=2`), `seed`.
"""

import dataclasses
import functools
import inspect
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from retention.data import TASKS, Dataset
from retention.nn import LMConfig, size_config
from retention.parallel import DEFAULT_RULES, check_rules
from retention.train.convergence import METRIC_CHOICES
from retention.train.init_from import check_init
from retention.validation import check_choice, check_int, check_number


def _model_fields() -> list[tuple]:
    """ModelConfig's fields: a name, LMConfig's fields with their defaults less vocab_size, target_params."""
    lm_fields = [
        (f.name, f.type, field(default=f.default, default_factory=f.default_factory))
        for f in dataclasses.fields(LMConfig)
        if f.name != "vocab_size"
    ]
    name = ("name", str, field(default=MISSING))  # every preset names itself (the run folder and summary use it)
    return [name, *lm_fields, ("target_params", int | None, field(default=None))]


ModelConfig = dataclasses.make_dataclass(
    "ModelConfig",
    _model_fields(),
    module=__name__,
    namespace={
        "__doc__": "The model group: LMConfig's fields and defaults less vocab_size (the data sets it), a name, "
        "and target_params (when set, size_config picks d_model for that parameter count)."
    },
)

# LMConfig's fields and target_params, as words in an error message: make_lm_config writes them as `model.` keys
_MODEL_KEYS = re.compile(
    r"\b(" + "|".join(f.name for f in dataclasses.fields(ModelConfig) if f.name != "name") + r")\b"
)


@dataclass
class DataConfig:
    """What every task shares; the task's own schema adds its generator's arguments (retention/data)."""

    task: ClassVar[str]  # the TASKS entry, fixed by the schema (data=<task> selects it)
    seq_len: int = 64
    batch_size: int = 32
    prefetch: int = 2  # batches made ahead by the background thread


SCHEMA_DOCS = {
    "mqar": "MQAR (retention/data/mqar.py): vocab_size > seq_len, keys and values drawn from halves of the vocab.",
    "passkey": "Passkey retrieval (retention/data/passkey.py); evaluated at each of `depths` too.",
    "copy": "Selective copying (retention/data/selective_copy.py).",
    "text": "Packed text windows (retention/data/text.py): source=folder reads the text files under `path` with one "
    "of `extensions` (both None: the running Python's standard-library .py files); source=hf reads "
    "datasets.load_dataset(hf_name, data_files=hf_data_files, split=hf_split, streaming=hf_streaming), one "
    "document per row's hf_text_field. tokenizer: bytes (vocab 257), bpe (a byte-level BPE of vocab_size ids, "
    "default 4096) or file (the Hugging Face tokenizer.json at tokenizer_file); a bpe or file tokenizer is saved "
    "as tokenizer.json in the run folder. eod_token: the token ending each document (a token of the file's vocab "
    "such as </s>). sampler: random (training windows at random offsets) or epochs (a seeded permutation of the "
    "training windows per epoch). cache_dir: the token cache (None: $RETENTION_CACHE, else "
    "~/.cache/retention/text).",
}
_SET_BY_THE_TRAINER = ("seq_len", "batch_size", "seed", "tokenizer_path")  # DataConfig's, the run's, the run folder's


def _schema_field(parameter: inspect.Parameter) -> tuple:
    """A generator's keyword argument as a dataclass field with its default: a tuple becomes a list (what
    OmegaConf holds), so `depths: tuple[float, ...] = (0, 1)` is a `list[float]` field."""
    kind, default = parameter.annotation, parameter.default
    if typing.get_origin(kind) is tuple:
        kind = list[typing.get_args(kind)[0]]
    if isinstance(default, tuple):
        return parameter.name, kind, field(default_factory=functools.partial(list, default))
    return parameter.name, kind, field(default=default)


def _data_schema(task: str) -> type:
    """The data group's schema of `task`, made from its generator's keyword arguments and their defaults (the
    generator owns them; configs/data/<task>.yaml sets only what differs) on top of DataConfig's shared
    fields."""
    generator = TASKS[task]
    parameters = inspect.signature(generator).parameters.values()
    fields = [_schema_field(p) for p in parameters if p.name not in _SET_BY_THE_TRAINER]
    namespace = {"task": task, "__doc__": SCHEMA_DOCS[task]}
    name = f"{generator.__name__}DataConfig"
    return dataclasses.make_dataclass(name, fields, bases=(DataConfig,), module=__name__, namespace=namespace)


DATA_SCHEMAS = {task: _data_schema(task) for task in TASKS}


@dataclass
class OptimConfig:
    """AdamW with a warmup-cosine learning rate (to lr * min_lr_ratio) and global-norm clipping.

    accumulate: N >= 1 micro-batches (of data.batch_size rows) per optimizer step, their gradients averaged
    (optax.MultiSteps): the step one batch of N * data.batch_size rows makes, where each micro-batch holds as many
    labelled targets. trainer.steps, warmup_steps and the trainer's other step counts (log_every, eval_every,
    ckpt_every, early_stop.min_step) count micro-steps, one batch each, so the data seen and the learning rate
    against it do not depend on N: a run makes trainer.steps / N optimizer steps (trainer.steps must be a multiple
    of N), each at the schedule's rate at the first micro-step of its N; checkpoints may fall between them (the
    state holds the gradients summed so far)."""

    name: str = "adamw"
    lr: float = 3e-3
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    clip_norm: float = 1.0
    accumulate: int = 1


@dataclass
class EarlyStopConfig:
    """The convergence rule (retention/train/convergence.py) on the trainer's eval at the training length: stop
    once `metric` has not improved by more than `min_delta` for `patience` evals (trainer.eval_every) in a row,
    never before step `min_step`; trainer.steps is the cap (the lr schedule decays over it). patience 0: off.
    metric None: the task's (accuracy for mqar, passkey and copy; loss for text)."""

    patience: int = 0
    min_delta: float = 0.0
    min_step: int = 0
    metric: str | None = None


@dataclass
class TrainerConfig:
    """Steps (the cap when early_stop is on), logging, evaluation (at seq_len times each of eval_scales),
    checkpoints and throughput accounting."""

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
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)


@dataclass
class MeshConfig:
    """The device mesh (retention/parallel): data x fsdp x sequence x tensor must equal the device count of all
    processes (-1 in one axis: the devices the others leave); the logical-axis rules, [logical name, mesh axis or
    axes or null] pairs (retention/parallel/rules.py); and, for a multi-host job not started by a scheduler that
    jax.distributed detects (a multi-task Slurm step, mpirun), the coordinator "host:port", process count and rank."""

    data: int = -1
    fsdp: int = 1
    sequence: int = 1
    tensor: int = 1
    rules: list[Any] = field(default_factory=lambda: [list(rule) for rule in DEFAULT_RULES])
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


@dataclass
class DistillConfig:
    """Distillation from the teacher (the init_from model as loaded, before init_convert, frozen): the loss adds
    kl_weight * temperature^2 * KL(teacher || student) of the logits at `temperature` (mean over the labelled
    positions) and layer_weight * the mean over the converted layers of the MSE between each one's output and the
    output of the attention layer it replaced, on the teacher's input to that layer (LoLCATs). 0: off."""

    kl_weight: float = 0.0
    temperature: float = 1.0
    layer_weight: float = 0.0


@dataclass
class Config:
    """The run. init_from: start from an existing model ("run:DIR", a run folder or an export; its LMConfig is the
    run's, model.* may change only what does not contradict it: retention/train/init_from.py), init_convert: a
    pattern applied to it by `retention.nn.convert`, freeze: parameter-name globs (dotted key paths,
    "blocks.0.mlp.*") kept fixed, or "all_but_converted"; distill: see DistillConfig."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = MISSING  # one of DATA_SCHEMAS, from the data group
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    seed: int = 0
    init_from: str | None = None
    init_convert: str | None = None
    freeze: list[str] = field(default_factory=list)
    distill: DistillConfig = field(default_factory=DistillConfig)


def check_folder_name(name: str, value) -> str:
    """`value`, which names a folder inside another (model.name in a run folder's path): a non-empty string
    without a path separator, NUL, or a name of '.' or '..', so the run stays inside the folder it is meant for."""
    if not isinstance(value, str) or not value or value in (".", "..") or any(c in value for c in "/\\\0"):
        raise ValueError(
            f"{name} must be a folder name without '/', '\\', NUL, or '.'/'..' (it names the run's folder inside "
            f"the outputs or sweep folder), got {value!r}"
        )
    return value


def check_known_keys(cfg: Config) -> None:
    """Every key of `cfg` is a field of its group's schema: OmegaConf.to_object keeps a key added with `+`
    (`+model.d_modle=64`) as a stray attribute, which nothing would read."""
    groups = {"": cfg, **{f"{f.name}.": getattr(cfg, f.name) for f in dataclasses.fields(cfg)}}
    for prefix, node in groups.items():
        if not dataclasses.is_dataclass(node):
            continue
        allowed = [f.name for f in dataclasses.fields(node)]
        for key in vars(node).keys() - set(allowed):
            where = f"the {prefix[:-1]} group" if prefix else "the config"
            raise ValueError(f"unknown config key {prefix}{key}: the keys of {where} are {allowed}")


def register_configs() -> None:
    """Store the schema as `base_config`, which configs/config.yaml extends, and each data schema as
    `data/<task>_schema`, which configs/data/<task>.yaml extends; register the `folder_name` resolver
    that the run and sweep folder paths pass model.name through (check_folder_name)."""
    if not OmegaConf.has_resolver("folder_name"):
        OmegaConf.register_new_resolver("folder_name", lambda value: check_folder_name("model.name", value))
    store = ConfigStore.instance()
    store.store(name="base_config", node=Config)
    for task, schema in DATA_SCHEMAS.items():
        store.store(group="data", name=f"{task}_schema", node=schema)


TOKENIZER_FILE = "tokenizer.json"  # a text run's BPE, in its run folder


def make_dataset(data: DataConfig, seed: int, run_dir: str | None = None) -> Dataset:
    """The generator of `data`'s task from its schema's fields; a bad value raises ValueError naming its key.
    Text keeps its BPE tokenizer as run_dir/tokenizer.json (reused when there: a resumed run's)."""
    kwargs = dataclasses.asdict(data)
    check_int("data.prefetch", kwargs.pop("prefetch"))
    if data.task == "text" and run_dir is not None:
        kwargs["tokenizer_path"] = os.path.join(run_dir, TOKENIZER_FILE)
    try:
        return TASKS[data.task](**kwargs, seed=seed)
    except ValueError as e:
        raise ValueError(f"data.{e}") from None


def make_lm_config(model: ModelConfig, vocab_size: int) -> LMConfig:
    """The LMConfig of `model` over `vocab_size` ids, d_model chosen by size_config when target_params is set.
    A bad value raises ValueError with every field it names written as its key (`model.n_layers`)."""
    kwargs = {f.name: getattr(model, f.name) for f in dataclasses.fields(LMConfig) if f.name != "vocab_size"}
    try:
        lm = LMConfig(**kwargs, vocab_size=vocab_size)
        if model.target_params is not None:
            lm = size_config(lm, model.target_params)
    except ValueError as e:
        raise ValueError(_MODEL_KEYS.sub(r"model.\1", str(e))) from None
    return lm


def check_optim_trainer(optim: OptimConfig, trainer: TrainerConfig) -> None:
    """Value checks of the optim and trainer groups (ValueError naming the key)."""
    check_choice("optim.name", optim.name, ("adamw",))
    for key in ("lr", "eps", "clip_norm"):
        check_number(f"optim.{key}", getattr(optim, key), low=0, open_low=True)
    check_number("optim.weight_decay", optim.weight_decay, low=0)
    for key in ("b1", "b2"):
        check_number(f"optim.{key}", getattr(optim, key), low=0, high=1, open_high=True)
    check_number("optim.min_lr_ratio", optim.min_lr_ratio, low=0, high=1)
    for key in ("steps", "log_every", "eval_batches", "ckpt_every", "keep", "cache_len"):
        check_int(f"trainer.{key}", getattr(trainer, key))
    check_int("trainer.eval_every", trainer.eval_every, low=0)
    check_number("trainer.peak_flops", trainer.peak_flops, low=1)
    check_int("optim.accumulate", optim.accumulate)
    if trainer.steps % optim.accumulate:
        raise ValueError(
            f"trainer.steps must be a multiple of optim.accumulate={optim.accumulate} (it counts micro-batches, "
            f"{optim.accumulate} to an optimizer step), got {trainer.steps}"
        )
    if not 0 <= optim.warmup_steps < trainer.steps:
        raise ValueError(f"optim.warmup_steps must be in [0, trainer.steps={trainer.steps}), got {optim.warmup_steps}")
    if not trainer.eval_scales:
        raise ValueError("trainer.eval_scales must list at least one multiple of data.seq_len, got []")
    for scale in trainer.eval_scales:
        check_int("trainer.eval_scales[i]", scale)
    check_early_stop(trainer)


def check_early_stop(trainer: TrainerConfig) -> None:
    """Value checks of trainer.early_stop (ValueError naming the key): the rule needs evals during the run
    (trainer.eval_every) at the training length (scale 1 in trainer.eval_scales)."""
    rule = trainer.early_stop
    check_int("trainer.early_stop.patience", rule.patience, low=0)
    check_number("trainer.early_stop.min_delta", rule.min_delta, low=0)
    check_int("trainer.early_stop.min_step", rule.min_step, low=0)
    if rule.metric is not None:
        check_choice("trainer.early_stop.metric", rule.metric, METRIC_CHOICES)
    if not rule.patience:
        return
    if not trainer.eval_every:
        raise ValueError(
            f"trainer.early_stop.patience={rule.patience} needs evals during the run: set trainer.eval_every > 0 "
            "(it is 0: only at the end)"
        )
    if 1 not in trainer.eval_scales:
        raise ValueError(
            "trainer.early_stop.patience > 0 judges the eval at the training length: trainer.eval_scales must "
            f"include 1, got {trainer.eval_scales}"
        )
    if rule.min_step >= trainer.steps:
        raise ValueError(
            f"trainer.early_stop.min_step must be below trainer.steps={trainer.steps} (the cap), got {rule.min_step}"
        )


SEED_LIMIT = 2**32  # jax.random.key keeps 32 bits of a seed: larger seeds would repeat smaller ones


def build(cfg: Config, run_dir: str | None = None) -> tuple[LMConfig, Dataset]:
    """Check every value of `cfg`; returns the model's LMConfig and the data generator (a text run's tokenizer
    kept in `run_dir`)."""
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed < SEED_LIMIT:
        raise ValueError(f"seed must be an int in [0, 2**32), got {cfg.seed!r}")
    check_known_keys(cfg)
    check_folder_name("model.name", cfg.model.name)
    check_optim_trainer(cfg.optim, cfg.trainer)
    check_rules(cfg.mesh.rules)
    check_init(cfg)
    dataset = make_dataset(cfg.data, cfg.seed, run_dir)
    if cfg.trainer.early_stop.metric == "bits_per_byte" and cfg.data.task != "text":
        raise ValueError(f"trainer.early_stop.metric='bits_per_byte' is a text metric, the task is {cfg.data.task!r}")
    for scale in cfg.trainer.eval_scales:
        dataset.check_length(f"data.seq_len * trainer.eval_scales[i] (scale {scale})", scale * cfg.data.seq_len)
    return make_lm_config(cfg.model, dataset.vocab_size), dataset
