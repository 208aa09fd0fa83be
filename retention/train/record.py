"""What a run folder holds: the run's record (its resolved config, LMConfig and parameter shapes) in `run.json`
and in every checkpoint, the check that a resumed run is the same run, and JSON files that are always valid.

A run may be resumed with other values of what only schedules or places the work (`trainer.*`, `mesh.*`,
`data.prefetch`, the op paths `model.retention_impl` and `model.attention_impl`); any other difference (model,
data, optimizer, seed) or other parameter shapes is a different run, refused with the keys listed; so is a text
run whose tokenizer or corpus content differs from the fingerprints its record holds.
"""

import contextlib
import dataclasses
import hashlib
import json
import math
import os

import jax

from retention.nn import LMConfig
from retention.train.config import (
    DATA_SCHEMAS,
    Config,
    DistillConfig,
    EarlyStopConfig,
    MeshConfig,
    ModelConfig,
    OptimConfig,
    TrainerConfig,
)

RECORD_FILE = "run.json"
MAY_CHANGE = ("trainer.", "mesh.", "data.prefetch", "model.retention_impl", "model.attention_impl")


FINGERPRINTS = {"tokenizer": "the run folder's tokenizer.json", "corpus": "the content of the training files"}


class RunMismatch(ValueError):
    """The run folder (or a checkpoint in it) holds another run than the config asks for."""


def config_dict(cfg: Config) -> dict:
    """`cfg` as nested plain values, with the data group's task (a ClassVar of its schema) under data.task."""
    out = dataclasses.asdict(cfg)
    out["data"]["task"] = cfg.data.task
    return out


def config_from_dict(d: dict) -> Config:
    """The Config that `config_dict` wrote (keys a newer LMConfig added take their defaults)."""
    data, trainer = dict(d["data"]), dict(d["trainer"])
    trainer["early_stop"] = EarlyStopConfig(**trainer.get("early_stop", {}))  # a record older than the rule: off
    schema = DATA_SCHEMAS[data.pop("task")]
    return Config(
        model=ModelConfig(**d["model"]),
        data=schema(**data),
        optim=OptimConfig(**d["optim"]),
        trainer=TrainerConfig(**trainer),
        mesh=MeshConfig(**d["mesh"]),
        seed=d["seed"],
        init_from=d.get("init_from"),  # a record older than init_from: a run from scratch
        init_convert=d.get("init_convert"),
        freeze=list(d.get("freeze", [])),
        distill=DistillConfig(**d.get("distill", {})),
    )


def param_shapes(params) -> dict[str, list]:
    """{key path: [shape, dtype name]} of a parameter tree (arrays or jax.ShapeDtypeStructs)."""
    return {
        jax.tree_util.keystr(p): [list(x.shape), str(x.dtype)] for p, x in jax.tree_util.tree_leaves_with_path(params)
    }


def run_record(cfg: Config, lm: LMConfig, abstract_params, data_fingerprints: dict | None = None) -> dict:
    """The record written with the run and each checkpoint: the resolved config, the LMConfig it builds (d_model
    as size_config chose it), the model's parameter shapes and, for text, the data's fingerprints (the
    tokenizer's and the corpus's content hashes: Text.fingerprints)."""
    record = {"config": config_dict(cfg), "lm": dataclasses.asdict(lm), "param_shapes": param_shapes(abstract_params)}
    if data_fingerprints:
        record["data_fingerprints"] = data_fingerprints
    return record


def record_digest(record: dict) -> str:
    """sha256 of the record's canonical JSON: stored beside it in a checkpoint, so a damaged record is caught."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _defaults(task: str) -> dict:
    """Every config key's schema default for `task` (a key one side lacks counts as its default)."""
    return _flat(config_dict(Config(model=ModelConfig(), data=DATA_SCHEMAS[task]())))


def differences(saved: dict, current: dict) -> list[str]:
    """ "key: saved value -> current value" for each key of two records that differs and may not change on resume,
    then each parameter whose shape or dtype differs."""
    a, b = _flat(saved["config"]), _flat(current["config"])
    defaults = _defaults(current["config"]["data"]["task"])
    lines = []
    for key in sorted(a.keys() | b.keys()):
        if not key.startswith(MAY_CHANGE):
            was, now = a.get(key, defaults.get(key)), b.get(key, defaults.get(key))
            if was != now:
                lines.append(f"{key}: {was!r} -> {now!r}")
    was, now = saved.get("data_fingerprints", {}), current.get("data_fingerprints", {})
    for key in sorted(was.keys() & now.keys()):  # a record written before fingerprints has none to compare
        if was[key] != now[key]:
            lines.append(f"the {key} ({FINGERPRINTS[key]}): fingerprint {was[key]} -> {now[key]}")
    if not lines:  # the same config building other shapes: the model code changed
        shapes_a, shapes_b = saved.get("param_shapes", {}), current["param_shapes"]
        for key in sorted(shapes_a.keys() | shapes_b.keys()):
            if shapes_a.get(key) != shapes_b.get(key):
                lines.append(f"parameter {key}: {shapes_a.get(key)} -> {shapes_b.get(key)}")
    return lines


def check_same_run(saved: dict, current: dict, where: str) -> None:
    """RunMismatch listing the differences when `saved` (the record in `where`) is another run than `current`."""
    lines = differences(saved, current)
    if lines:
        raise RunMismatch(
            f"{where} holds another run than this config: {'; '.join(lines)}. Only trainer.*, mesh.*, "
            "data.prefetch, model.retention_impl and model.attention_impl may change when a run resumes. To train "
            "this config, start a fresh run in another folder (hydra.run.dir=<new folder>), or move the old run's "
            "checkpoints/ and run.json away."
        )


def finite_json(value):
    """`value` with every NaN or inf float replaced by None, so json.dumps writes valid JSON (null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def write_json(path: str, value) -> None:
    """Write `value` as JSON (NaN and inf as null) to `path` atomically: a reader sees the old file or the new."""
    write_text(path, json.dumps(finite_json(value), indent=2, allow_nan=False))


def write_text(path: str, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically, as `write_bytes`."""
    write_bytes(path, text.encode())


def write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` (its folder made if needed) atomically: a new file renamed over the old, so a reader
    sees one or the other and a symbolic link at `path` is replaced, never followed."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a killed process of the same pid; "x" then never follows a link there
    with open(tmp, "xb") as f:
        f.write(data)
    os.replace(tmp, path)


def read_record(run_dir: str) -> dict | None:
    """The record in `run_dir`/run.json, or None when there is none."""
    path = os.path.join(run_dir, RECORD_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
