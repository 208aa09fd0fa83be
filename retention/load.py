"""Out of a run: the trained model and the run's config, from a run folder of train.py or from an export.

    model, cfg = retention.load_run("outputs/mqar/hybrid/2026-01-01_12-00-00")
    out = retention.generate(model, prompt, 32, temperature=0.0)

A run folder's checkpoints carry the run's record (config, LMConfig, parameter shapes) and a checksum per array
(retention/train/checkpoint.py); an export (`python -m retention.export RUN_DIR OUT`) is model.safetensors and
config.json with the same record, each checked against the other and every tensor against its checksum on load
(retention/export.py).
"""

import json
import logging
import os
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from retention.nn import LM, LMConfig
from retention.nn.model import convert_layers
from retention.parallel import state_shardings
from retention.train.checkpoint import Checkpoints
from retention.train.checksum import mismatched
from retention.train.config import Config
from retention.train.record import RECORD_FILE, config_from_dict, record_digest

log = logging.getLogger(__name__)
EXPORT_WEIGHTS, EXPORT_CONFIG = "model.safetensors", "config.json"


class LoadedRun(NamedTuple):
    model: LM
    record: dict  # {"config", "lm", "param_shapes"}: see retention/train/record.py
    step: int  # the training step the parameters are from


def weight_name(path) -> str:
    """A parameter's name in an export: its key path joined by dots (blocks.0.mixer.q_proj.kernel.value)."""
    return jax.tree_util.keystr(path, simple=True, separator=".")


def _abstract(lm: LMConfig, mesh: Mesh | None):
    """(graphdef, the parameters' ShapeDtypeStructs in their placements): FSDP-sharded over `mesh` (default: the
    mesh set by jax.set_mesh, if any), else on the default device."""
    graphdef, params = nnx.split(nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(0))))
    mesh = mesh if mesh is not None else jax.sharding.get_mesh()
    if mesh.empty:
        shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), params)
    else:
        shardings = state_shardings(params, mesh)
    placed = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params, shardings)
    return graphdef, placed


def is_run_folder(folder: str) -> bool:
    """Whether `folder` is a train.py run folder (its run.json or checkpoints/ there), whatever else it holds."""
    return os.path.exists(os.path.join(folder, RECORD_FILE)) or os.path.isdir(os.path.join(folder, "checkpoints"))


def _read_export(folder: str) -> tuple[dict, dict]:
    """(config.json, the weights by name) of an export folder, each checked against the other: config.json's
    record against its sha256, the weights file's record sha256 and step against config.json's, and each
    tensor against its checksum; ValueError naming the file and what differs."""
    from safetensors import SafetensorError, safe_open

    config_path, weights_path = os.path.join(folder, EXPORT_CONFIG), os.path.join(folder, EXPORT_WEIGHTS)
    try:
        with open(config_path) as f:
            exported = json.load(f)
        record, digest, step = exported["record"], exported["record_sha256"], exported["step"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{config_path} is damaged or not an export's ({type(e).__name__}: {e})") from None
    if record_digest(record) != digest:
        raise ValueError(f"{config_path} is damaged: its run record does not match its sha256")
    try:
        with safe_open(weights_path, framework="numpy") as f:
            meta = f.metadata() or {}
            weights = {name: f.get_tensor(name) for name in f.keys()}
        saved = json.loads(meta["checksums"])
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise ValueError(f"{weights_path} is damaged or not an export's ({type(e).__name__}: {e})") from None
    if meta.get("record_sha256") != digest or meta.get("step") != str(step):
        raise ValueError(
            f"{weights_path} and {config_path} are of different exports (record sha256 "
            f"{meta.get('record_sha256')} at step {meta.get('step')} against {digest} at step {step}): export the "
            "run again"
        )
    if bad := mismatched(saved, weights)[0]:
        raise ValueError(f"{weights_path} is damaged: {len(bad)} tensors differ from their checksums ({bad[0]} first)")
    return exported, weights


def _from_export(folder: str, step: int | None, mesh: Mesh | None) -> LoadedRun:
    exported, weights = _read_export(folder)
    if step is not None and step != exported["step"]:
        raise ValueError(f"step must be None or {exported['step']} (the step {folder} was exported from), got {step}")
    graphdef, abstract = _abstract(LMConfig(**exported["record"]["lm"]), mesh)
    names = {weight_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(abstract)}
    if names != weights.keys():
        raise ValueError(
            f"{folder}/{EXPORT_WEIGHTS} does not hold this model's parameters: {sorted(names ^ weights.keys())[:4]}"
        )

    def place(path, x):
        w = weights[weight_name(path)]
        if w.shape != x.shape or w.dtype != x.dtype:
            raise ValueError(
                f"{weight_name(path)} in {folder} is {w.dtype}{list(w.shape)}, expected {x.dtype}{list(x.shape)}"
            )
        return jax.device_put(np.asarray(w), x.sharding)

    params = jax.tree_util.tree_map_with_path(place, abstract)
    return LoadedRun(nnx.merge(graphdef, params), exported["record"], exported["step"])


def _from_checkpoints(run_dir: str, step: int | None, mesh: Mesh | None) -> LoadedRun:
    ckpt = Checkpoints(os.path.join(run_dir, "checkpoints"), read_only=True)
    try:
        steps = ckpt.steps()
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {ckpt.directory} (and no {EXPORT_CONFIG} in {run_dir})")
        if step is not None and step not in steps:
            raise ValueError(f"step must be None or one of the checkpoints {steps} in {ckpt.directory}, got {step}")
        for s in [step] if step is not None else reversed(steps):
            try:
                record = ckpt.metadata(s)["record"]
                graphdef, abstract = _abstract(LMConfig(**record["lm"]), mesh)
                return LoadedRun(nnx.merge(graphdef, ckpt.restore_params(s, abstract)), record, s)
            except Exception as e:
                if step is not None:
                    raise
                log.warning("skipping checkpoint %d in %s: %s: %s", s, ckpt.directory, type(e).__name__, e)
        raise ValueError(f"no intact checkpoint in {ckpt.directory} (steps {steps})")
    finally:
        ckpt.close()


def read_run(run_dir: str, step: int | None = None, *, mesh: Mesh | None = None) -> LoadedRun:
    """The model (parameters only) of a run folder's checkpoint `step` (None: the newest intact one) or of an
    export folder, with the run's record and step; see `load_run`. A run folder (run.json or checkpoints/ there)
    is read from its checkpoints whatever else it holds; an export folder is one with config.json and neither."""
    if not is_run_folder(run_dir) and os.path.exists(os.path.join(run_dir, EXPORT_CONFIG)):
        return _from_export(run_dir, step, mesh)
    return _from_checkpoints(run_dir, step, mesh)


def load_run(
    run_dir: str, step: int | None = None, *, mesh: Mesh | None = None, scan_layers: bool | None = None
) -> tuple[LM, Config]:
    """(the trained LM, the run's Config) from a train.py run folder or an export (`python -m retention.export`).

    Only the parameters are read (not the optimizer state), each checked against its checkpoint checksum; they
    are placed on the default device, or FSDP-sharded over `mesh` (default: the mesh of jax.set_mesh, if set).
    `step`: a checkpoint's step; None takes the newest intact one (a damaged one is skipped with a warning).
    `scan_layers`: None keeps the form the run trained; True or False converts the parameters to the scanned or
    unscanned form (`retention.nn.model.convert_layers`); the model's config says which, the Config the run's.
    """
    loaded = read_run(run_dir, step, mesh=mesh)
    model = loaded.model
    if scan_layers is not None and scan_layers != model.config.scan_layers:
        model = convert_layers(model, scan_layers)
        mesh = mesh if mesh is not None else jax.sharding.get_mesh()
        if not mesh.empty:
            params = nnx.state(model)
            nnx.update(model, jax.device_put(params, state_shardings(params, mesh)))
    return model, config_from_dict(loaded.record["config"])
