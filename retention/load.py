"""Out of a run: the trained model, the run's config and its tokenizer, from a run folder of train.py or from an
export.

    model, cfg, tokenizer = retention.load_run("outputs/text/hybrid/2026-01-01_12-00-00")
    out = retention.generate(model, prompt, 32, temperature=0.0)

A run folder's checkpoints carry the run's record (config, LMConfig, parameter shapes) and a checksum per array
(retention/train/checkpoint.py); an export (`python -m retention.export RUN_DIR OUT`) is model.safetensors, an
HF-style config.json, the run record (run_record.json) and the run's tokenizer.json, each checked against the
others and every tensor against its checksum on load (retention/export.py). The tokenizer is the run's
tokenizer.json (a bpe or file tokenizer, checked against the record's fingerprint), None for a run without one
(the bytes tokenizer, or a synthetic task).
"""

import dataclasses
import json
import logging
import os
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from retention.checksum import mismatched
from retention.data.tokenizer import HFTokenizer
from retention.hf.config_out import hf_config, weight_name
from retention.hf.load import build_lm
from retention.hf.names import pure_from_llama
from retention.nn import LM, LMConfig
from retention.nn.model import convert_layers
from retention.parallel import state_shardings
from retention.train.checkpoint import Checkpoints
from retention.train.config import Config
from retention.train.record import RECORD_FILE, config_from_dict, record_digest

log = logging.getLogger(__name__)
EXPORT_WEIGHTS, EXPORT_CONFIG, EXPORT_RECORD = "model.safetensors", "config.json", "run_record.json"
TOKENIZER = "tokenizer.json"


class LoadedRun(NamedTuple):
    model: LM
    record: dict  # {"config", "lm", "param_shapes"}: see retention/train/record.py
    step: int  # the training step the parameters are from


class Run(NamedTuple):
    """What `load_run` returns.

    Attributes:
        model: the trained LM.
        config: the run's Config (retention/train/config.py).
        tokenizer: the run's tokenizer; None for the bytes tokenizer or a synthetic task.
    """

    model: LM
    config: Config
    tokenizer: HFTokenizer | None


def max_positions(record: dict) -> int:
    """The longest sequence the run trained or evaluated: data.seq_len times the largest trainer.eval_scales."""
    config = record["config"]
    return config["data"]["seq_len"] * max(config["trainer"].get("eval_scales") or [1])


def run_tokenizer(folder: str, record: dict) -> HFTokenizer | None:
    """The run's tokenizer: `folder`/tokenizer.json for a text run whose tokenizer is bpe or file, checked against
    the record's fingerprint (ValueError naming the file when it is missing or another); None otherwise."""
    data = record["config"]["data"]
    if data.get("task") != "text" or data.get("tokenizer", "bytes") == "bytes":
        return None
    path = os.path.join(folder, TOKENIZER)
    if not os.path.isfile(path):
        raise ValueError(f"{path} is missing: the run's tokenizer ({data['tokenizer']}) is kept there")
    tokenizer = HFTokenizer.load(path, data["eod_token"])
    want = record.get("data_fingerprints", {}).get("tokenizer")
    if want is not None and tokenizer.identity != want:
        raise ValueError(f"{path} is not the run's tokenizer: fingerprint {tokenizer.identity}, the record's {want}")
    return tokenizer


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


def _read_json(path: str, keys: tuple) -> dict:
    """The JSON object at `path` holding `keys`; ValueError naming the file when it is damaged or lacks them."""
    try:
        with open(path) as f:
            value = json.load(f)
        if missing := [key for key in keys if key not in value]:
            raise KeyError(missing[0])
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise ValueError(f"{path} is damaged or not an export's ({type(e).__name__}: {e})") from None
    return value


def _read_export(folder: str) -> tuple[dict, dict, dict]:
    """(run_record.json, config.json's "retention_export", the weights by name) of an export folder, each checked
    against the others: the record against its sha256, config.json's and the weights file's record sha256 and step
    against the record's, config.json's fields against those the record's model gives, and each tensor against its
    checksum; ValueError naming the file and what differs."""
    from safetensors import SafetensorError, safe_open

    record_path, config_path = os.path.join(folder, EXPORT_RECORD), os.path.join(folder, EXPORT_CONFIG)
    weights_path = os.path.join(folder, EXPORT_WEIGHTS)
    exported = _read_json(record_path, ("record", "record_sha256", "step"))
    record, digest, step = exported["record"], exported["record_sha256"], exported["step"]
    if record_digest(record) != digest:
        raise ValueError(f"{record_path} is damaged: its run record does not match its sha256")
    config = _read_json(config_path, ("retention_export",))
    export = config.pop("retention_export")
    if (export.get("record_sha256"), export.get("step")) != (digest, step):
        raise ValueError(
            f"{config_path} and {record_path} are of different exports (record sha256 {export.get('record_sha256')} "
            f"at step {export.get('step')} against {digest} at step {step}): export the run again"
        )
    lm = LMConfig.from_record(record["lm"])
    want = hf_config(lm, max_position_embeddings=max_positions(record), eos_token_id=config.get("eos_token_id"))
    if "auto_map" not in config:  # an export written before the retention layout carried its PyTorch code
        want.pop("auto_map", None)
    if differ := sorted(k for k in want.keys() | config.keys() if want.get(k) != config.get(k)):
        raise ValueError(
            f"{config_path} is damaged: {differ[0]}={config.get(differ[0])!r}, the run record's model has "
            f"{want.get(differ[0])!r} (fields that differ: {differ[:6]})"
        )
    try:
        with safe_open(weights_path, framework="numpy") as f:
            meta = f.metadata() or {}
            weights = {name: f.get_tensor(name) for name in f.keys()}
        saved = json.loads(meta["checksums"])
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise ValueError(f"{weights_path} is damaged or not an export's ({type(e).__name__}: {e})") from None
    if meta.get("record_sha256") != digest or meta.get("step") != str(step):
        raise ValueError(
            f"{weights_path} and {record_path} are of different exports (record sha256 "
            f"{meta.get('record_sha256')} at step {meta.get('step')} against {digest} at step {step}): export the "
            "run again"
        )
    if meta.get("layout") != export.get("layout"):
        raise ValueError(
            f"{weights_path} is in the {meta.get('layout')} layout, {config_path} says {export.get('layout')}"
        )
    if bad := mismatched(saved, weights)[0]:
        raise ValueError(f"{weights_path} is damaged: {len(bad)} tensors differ from their checksums ({bad[0]} first)")
    return exported, export, weights


def _from_export(folder: str, step: int | None, mesh: Mesh | None) -> LoadedRun:
    exported, export, weights = _read_export(folder)
    if step is not None and step != exported["step"]:
        raise ValueError(f"step must be None or {exported['step']} (the step {folder} was exported from), got {step}")
    lm = LMConfig.from_record(exported["record"]["lm"])
    if export["layout"] == "llama":
        where = f"{folder}/{EXPORT_WEIGHTS}"
        model = build_lm(dataclasses.replace(lm, scan_layers=False), pure_from_llama(lm, weights, where), where)
        model = convert_layers(model, lm.scan_layers)
        weights = {weight_name(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(nnx.state(model))}
    graphdef, abstract = _abstract(lm, mesh)
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
            raise FileNotFoundError(
                f"no checkpoint in {ckpt.directory} (and no export: no {EXPORT_RECORD} in {run_dir})"
            )
        if step is not None and step not in steps:
            raise ValueError(f"step must be None or one of the checkpoints {steps} in {ckpt.directory}, got {step}")
        for s in [step] if step is not None else reversed(steps):
            try:
                record = ckpt.metadata(s)["record"]
                graphdef, abstract = _abstract(LMConfig.from_record(record["lm"]), mesh)
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
    is read from its checkpoints whatever else it holds; an export folder is one with run_record.json and
    neither."""
    if not is_run_folder(run_dir) and os.path.exists(os.path.join(run_dir, EXPORT_RECORD)):
        return _from_export(run_dir, step, mesh)
    return _from_checkpoints(run_dir, step, mesh)


def load_run(
    run_dir: str, step: int | None = None, *, mesh: Mesh | None = None, scan_layers: bool | None = None
) -> Run:
    """The trained model, the run's config and its tokenizer, from a train.py run folder or an export
    (`python -m retention.export`).

    Only the parameters are read (not the optimizer state), each checked against its checkpoint checksum; they are
    placed on the default device, or FSDP-sharded over `mesh`.

    ```python
    model, cfg, tokenizer = retention.load_run("outputs/text/hybrid/2026-01-01_12-00-00")
    ```

    Args:
        run_dir: the run or export folder. A run folder (run.json or checkpoints/ there) is read from its checkpoints
            whatever else it holds.
        step: a checkpoint's step; None takes the newest intact one (a damaged one is skipped with a warning).
        mesh: shard the parameters over this mesh; None: the mesh of jax.set_mesh, if set.
        scan_layers: None keeps the form the run trained; True or False converts the parameters to the scanned or
            unscanned form (`retention.nn.model.convert_layers`); the model's config says which, the Config the
            run's.

    Returns:
        Run(model, config, tokenizer).

    Raises:
        ValueError: no intact checkpoint, a step that is not one, or an export whose files do not match one another,
            their checksums or the run's tokenizer.
        FileNotFoundError: a folder with no checkpoints.
    """
    loaded = read_run(run_dir, step, mesh=mesh)
    model = loaded.model
    if scan_layers is not None and scan_layers != model.config.scan_layers:
        model = convert_layers(model, scan_layers)
        mesh = mesh if mesh is not None else jax.sharding.get_mesh()
        if not mesh.empty:
            params = nnx.state(model)
            nnx.update(model, jax.device_put(params, state_shardings(params, mesh)))
    return Run(model, config_from_dict(loaded.record["config"]), run_tokenizer(run_dir, loaded.record))
