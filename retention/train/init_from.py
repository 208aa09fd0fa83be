"""Training from an existing model (`init_from=run:DIR`): the source, its conversion (`init_convert`), the run's
LMConfig (the source's: model.* may only set what does not contradict it) and the frozen parameters (`freeze`).

A source is `<prefix>:<folder>`; `SOURCES` maps each prefix to its loader, named as "module:function" (the
loaders sit above the trainer, retention.load, so the trainer names them rather than importing them); a loader
takes the folder and returns a tuple whose first item is the LM (`load_run`'s Run, `load_hf`'s (LM, tokenizer)).
A new source is one line there.
"""

import dataclasses
import fnmatch
import importlib
from typing import NamedTuple

import jax
import optax
from flax import nnx

from retention.nn import LM, LMConfig, convert
from retention.nn.convert import SETTINGS
from retention.nn.model import convert_layers
from retention.validation import check_number

SOURCES = {  # prefix: "module:function" of its loader
    "run": "retention.load:load_run",  # a run folder or an export
    "hf": "retention.hf:load_hf",  # a Hugging Face folder: Llama family, Mamba2, Qwen3-Next (retention/hf/)
}
# model.* fields that set how the source runs, not what it is (applied to it after conversion)
RUNTIME = ("dtype", "retention_impl", "attention_impl", "chunk_size", "kv_cache_bits", "scan_layers", "remat_policy")
ALL_BUT_CONVERTED = "all_but_converted"  # freeze: every parameter outside the converted layers' mixers


class Start(NamedTuple):
    """What a run from an existing model starts with: the model to train, the teacher (the source as loaded,
    unscanned) and the indices of the layers init_convert replaced."""

    model: LM
    teacher: LM
    converted: tuple[int, ...]


def check_source(spec) -> tuple[str, str]:
    """(prefix, folder) of an init_from value `<prefix>:<folder>` with a prefix of SOURCES."""
    prefix, _, folder = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if prefix not in SOURCES or not folder:
        raise ValueError(f"init_from must be <source>:<folder> with a source of {sorted(SOURCES)}, got {spec!r}")
    return prefix, folder


def load_source(spec: str) -> LM:
    """The LM of an init_from value, read by its prefix's loader (`SOURCES`)."""
    prefix, folder = check_source(spec)
    module, function = SOURCES[prefix].split(":")
    return getattr(importlib.import_module(module), function)(folder)[0]


def model_overrides(model_cfg, defaults, source: LMConfig, spec: str, converting: bool) -> tuple[dict, dict]:
    """(the conversion's mixer settings, the RUNTIME changes) that `model_cfg` (the model group) sets: each field
    that differs from both its schema default (`defaults`, a ModelConfig()) and the source's value. Any other such
    field contradicts the source: ValueError naming it (model.target_params too)."""
    if model_cfg.target_params is not None:
        raise ValueError(
            f"model.target_params={model_cfg.target_params} sizes a new model; with init_from={spec!r} the model's "
            "sizes are the source's: set model.target_params=null (model=source does)"
        )
    settings, runtime = {}, {}
    for f in dataclasses.fields(LMConfig):
        if f.name == "vocab_size":
            continue
        value, theirs = getattr(model_cfg, f.name), getattr(source, f.name)
        if value == getattr(defaults, f.name) or value == theirs:
            continue
        if f.name in RUNTIME:
            runtime[f.name] = value
        elif converting and f.name in SETTINGS:
            settings[f.name] = value
        else:
            allowed = list(RUNTIME) + ([f"{s} (for init_convert)" for s in SETTINGS] if converting else [])
            raise ValueError(
                f"model.{f.name}={value!r} contradicts the source {spec!r}, whose {f.name} is {theirs!r}: with "
                f"init_from the model is the source's (model=source leaves every field to it); model.* may set "
                f"only {allowed}"
            )
    return settings, runtime


def with_runtime(model: LM, changes: dict) -> LM:
    """`model` with the RUNTIME fields `changes` set: the same parameters (scan_layers restacks them)."""
    changes = dict(changes)
    if "scan_layers" in changes:
        model = convert_layers(model, changes.pop("scan_layers"))
    if not changes:
        return model
    target = dataclasses.replace(model.config, **changes)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: LM(target, rngs=nnx.Rngs(0))))
    nnx.replace_by_pure_dict(abstract, nnx.to_pure_dict(nnx.state(model)))
    return nnx.merge(graphdef, abstract)


def start_model(cfg, defaults, vocab_size: int) -> Start:
    """The model a run with `cfg.init_from` trains: the source, converted by cfg.init_convert (settings from
    model.*), with model.*'s RUNTIME fields; ValueError naming the key when the data's vocabulary differs from
    the source's or model.* contradicts it. `defaults`: the model group's schema defaults (a ModelConfig())."""
    teacher = load_source(cfg.init_from)
    source = teacher.config
    if vocab_size != source.vocab_size:
        raise ValueError(
            f"the data's vocabulary ({vocab_size} ids) must be the source's: init_from={cfg.init_from!r} has "
            f"vocab_size={source.vocab_size} (set the data group's vocab_size or tokenizer to the source's)"
        )
    converting = cfg.init_convert is not None
    settings, runtime = model_overrides(cfg.model, defaults, source, cfg.init_from, converting)
    model, converted = teacher, ()
    if converting:
        try:
            model = convert(teacher, cfg.init_convert, seed=cfg.seed, **settings)
        except ValueError as e:
            raise ValueError(f"init_convert={cfg.init_convert!r}: {e}") from None
        converted = tuple(i for i, (a, b) in enumerate(zip(source.layer_kinds, model.config.layer_kinds)) if a != b)
    return Start(with_runtime(model, runtime), convert_layers(teacher, False), converted)


def check_start(cfg, lm: LMConfig) -> None:
    """What needs the converted model's layers one by one (freeze's ALL_BUT_CONVERTED, distill.layer_weight) needs
    it unscanned: ValueError naming model.scan_layers."""
    if lm.scan_layers and (ALL_BUT_CONVERTED in cfg.freeze or cfg.distill.layer_weight):
        raise ValueError(
            f"freeze={cfg.freeze} / distill.layer_weight={cfg.distill.layer_weight} read the converted layers one "
            "by one: they need model.scan_layers=false, got true"
        )


def check_init(cfg) -> None:
    """Value checks of init_from, init_convert, freeze and distill (ValueError naming the key): init_convert and
    distillation need init_from, ALL_BUT_CONVERTED and the layer term need init_convert."""
    if cfg.init_from is not None:
        check_source(cfg.init_from)
    if cfg.model.name == "source" and cfg.init_from is None:
        raise ValueError("model=source takes its model from init_from: set init_from=<source>:<folder>")
    if cfg.init_convert is not None and cfg.init_from is None:
        raise ValueError(f"init_convert={cfg.init_convert!r} converts an existing model: set init_from too")
    for glob in cfg.freeze:
        if not isinstance(glob, str) or not glob:
            raise ValueError(f"freeze must list parameter-name globs or {ALL_BUT_CONVERTED!r}, got {cfg.freeze}")
    if ALL_BUT_CONVERTED in cfg.freeze and cfg.init_convert is None:
        raise ValueError(f"freeze={cfg.freeze} names {ALL_BUT_CONVERTED!r}: set init_convert (what to convert)")
    d = cfg.distill
    check_number("distill.kl_weight", d.kl_weight, low=0)
    check_number("distill.layer_weight", d.layer_weight, low=0)
    check_number("distill.temperature", d.temperature, low=0, open_low=True)
    if (d.kl_weight or d.layer_weight) and cfg.init_from is None:
        raise ValueError(
            f"distill.kl_weight={d.kl_weight} / distill.layer_weight={d.layer_weight} distil from the init_from "
            "model: set init_from, or both weights to 0"
        )
    if d.layer_weight and cfg.init_convert is None:
        raise ValueError(
            f"distill.layer_weight={d.layer_weight} compares converted layers with the attention they replaced: "
            "set init_convert"
        )


def param_name(path) -> str:
    """A parameter's dotted key path without the trailing `.value` (blocks.0.mixer.q_proj.kernel)."""
    return jax.tree_util.keystr(path, simple=True, separator=".").removesuffix(".value")


def frozen_labels(params, patterns: list[str], converted: tuple[int, ...]):
    """ "frozen" or "train" per leaf of `params` (a model's state): frozen when its name matches a glob of
    `patterns`, or, with ALL_BUT_CONVERTED among them, when it is outside the mixers of the `converted` layers.
    ValueError naming `freeze` for a glob that matches no parameter."""
    names = [param_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    globs = [p for p in patterns if p != ALL_BUT_CONVERTED]
    for glob in globs:
        if not fnmatch.filter(names, glob):
            raise ValueError(f"freeze: {glob!r} matches no parameter; the parameters are named like {names[:3]}")
    trained = tuple(f"blocks.{i}.mixer.*" for i in converted)

    def label(path, _):
        name = param_name(path)
        outside = ALL_BUT_CONVERTED in patterns and not any(fnmatch.fnmatch(name, t) for t in trained)
        return "frozen" if outside or any(fnmatch.fnmatch(name, g) for g in globs) else "train"

    return jax.tree_util.tree_map_with_path(label, params)


def freeze(tx: optax.GradientTransformation, labels) -> optax.GradientTransformation:
    """`tx` with the "frozen" leaves of `labels` held: their gradients are zeroed before it (its clipping and
    moments see zeros) and their updates after it (weight decay included), so they never change. (Their moments
    are kept, zeros: optax.multi_transform's empty state has no shape for the state's shardings.)"""
    frozen = jax.tree.map(lambda label: label == "frozen", labels)
    hold = optax.stateless(lambda updates, params=None: jax.tree.map(_zero_if, updates, frozen))
    return optax.chain(hold, tx, hold)


def _zero_if(update, frozen: bool):
    return jax.numpy.zeros_like(update) if frozen else update
