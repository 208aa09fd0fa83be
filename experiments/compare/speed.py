"""Speed and memory of the compared models: the trainer's own compiled train step at each length T with the same
tokens per step (batch = tokens_per_step // T), greedy decode ms per token after each context, and decode-cache
bytes per sequence. Medians of several repeats after a warm-up; random byte tokens (speed does not depend on
the data). Returns a dict that `run.py` writes as speed.json; a model already in `done` (the speed.json of an
interrupted run) is not measured again when its recorded recipe (model overrides and speed settings) is the
preset's, and is measured again, with a warning, when it is not (a changed preset never reports stale times).
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from tqdm import tqdm

from experiments.compare.models import compose_config, entry_overrides, lm_cache_bytes
from experiments.compare.presets import Preset
from experiments.decode_speed import ms_per_token
from experiments.timing import run_times
from retention.data import Batch
from retention.nn import LM
from retention.parallel import batch_sharding, state_shardings
from retention.train.config import Config, make_lm_config
from retention.train.metrics import throughput, training_flops_per_token
from retention.train.optimizer import make_optimizer
from retention.train.step import TraceCount, device_batch, make_init, make_train_step

log = logging.getLogger(__name__)
VOCAB = 256  # byte-level, as the text task
CACHE_CONTEXTS = tuple(1024 * 4**i for i in range(6))  # 1k .. 1M tokens: shapes only, nothing allocated


def abstract_train_step(cfg: Config, T: int, B: int, *, vocab_size: int = VOCAB, mesh: Mesh | None = None):
    """(graphdef, tx, the train state's ShapeDtypeStructs, the compiled train step on [B, T] tokens of
    `vocab_size` ids): compiled from shapes alone, so a step too large to run here can still be compiled and its
    memory analysed. With a mesh, the trainer's sharded step: the state FSDP-sharded (`state_shardings`) and the
    batch split (`batch_sharding`), so the memory analysis is one device's."""
    lm = make_lm_config(cfg.model, vocab_size)
    tx, _ = make_optimizer(cfg.optim, 1000)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(cfg.seed))))
    state = jax.eval_shape(make_init(lm, tx, cfg.seed))
    tokens = jax.ShapeDtypeStruct((B, T), jnp.int32)
    batch = device_batch(Batch(tokens, tokens), put=lambda x: x)
    placement = {}
    if mesh is not None:
        placement = {
            "mesh": mesh,
            "state_shardings": state_shardings(state, mesh),
            "batch_sharding": batch_sharding(mesh),
        }
    step = make_train_step(graphdef, tx, TraceCount(), **placement)
    return graphdef, tx, state, step.lower(state, batch).compile()


def train_step_time(cfg: Config, T: int, B: int, repeats: int, peak_flops: float) -> dict:
    """Median seconds of one compiled train step on [B, T] tokens after a warm-up step, its throughput, and the
    compiled step's temporary and argument bytes (XLA's memory analysis)."""
    lm = make_lm_config(cfg.model, VOCAB)
    _, tx, _, compiled = abstract_train_step(cfg, T, B)
    state = jax.jit(make_init(lm, tx, cfg.seed))()
    tokens = jax.random.randint(jax.random.key(T), (B, T + 1), 0, VOCAB, dtype=jnp.int32)
    batch = device_batch(Batch(tokens[:, :-1], tokens[:, 1:]))
    memory = compiled.memory_analysis()

    def step():
        """One step from the state the last one returned (the step donates its input state)."""
        nonlocal state
        state, metrics = compiled(state, batch)
        return state, metrics

    times = run_times(step, repeats=repeats)
    seconds = float(np.median(times))
    perf = throughput(B * T, seconds, training_flops_per_token(lm, T), peak_flops)
    return {
        "T": T,
        "batch": B,
        "step_s": seconds,
        "times_s": times,
        **perf,
        "temp_bytes": memory.temp_size_in_bytes,
        "argument_bytes": memory.argument_size_in_bytes,
    }


def decode_time(cfg: Config, contexts, n_tokens: int, repeats: int) -> dict:
    """ms per greedy decode token (batch 1) after each context, and the caches' bytes there."""
    model = LM(make_lm_config(cfg.model, VOCAB), rngs=nnx.Rngs(cfg.seed))
    out = {}
    for context in contexts:
        ms, nbytes = ms_per_token(model, context, n_tokens, repeats)
        out[str(context)] = {"ms_per_token": ms, "cache_bytes": nbytes}
    return out


def speed_recipe(name: str, preset: Preset) -> dict:
    """What model `name`'s speed numbers depend on: its overrides and the preset's speed settings (JSON lists)."""
    speed = preset.speed
    return {
        "overrides": entry_overrides(name, preset),
        "lengths": list(speed.lengths),
        "tokens_per_step": speed.tokens_per_step,
        "decode_contexts": list(speed.decode_contexts),
        "decode_tokens": speed.decode_tokens,
        "repeats": speed.repeats,
    }


def speed_recipes(preset: Preset) -> dict[str, dict] | None:
    """The recipe of each of the preset's speed models (`speed_recipe`), which the report's speed results must match.

    Args:
        preset: the comparison's preset.

    Returns:
        {model: recipe}, or None for a preset without a speed stage.
    """
    return {m: speed_recipe(m, preset) for m in preset.speed.models} if preset.speed else None


def same_recipe(recorded: dict | None, today: dict) -> bool:
    """Whether a speed result's `recorded` recipe (`speed_recipe`; None before recipes were recorded, or any other
    value that is no recipe) is `today`'s: the same speed settings, and overrides that compose to the same config
    (a recipe's keys moved into its experiment file are the same model, as `quality.carry_over` reads a run)."""
    if not isinstance(recorded, dict) or "overrides" not in recorded:
        return False
    settings = lambda recipe: {k: v for k, v in recipe.items() if k != "overrides"}
    old, new = recorded["overrides"], today["overrides"]
    return settings(recorded) == settings(today) and (old == new or compose_config(old) == compose_config(new))


def reusable(preset: Preset, done: dict | None) -> dict:
    """The models of `done` measured with the preset's recipe for them (`same_recipe`)."""
    return {
        name: result
        for name, result in (done or {}).items()
        if name in preset.speed.models and same_recipe(result.get("recipe"), speed_recipe(name, preset))
    }


def unmeasured(preset: Preset, done: dict | None) -> list[str]:
    """The preset's speed models a call measures: those `done` (speed.json's results) lacks or measured with
    another recipe than the preset's (a warning names each of these)."""
    kept = reusable(preset, done)
    for name in (done or {}).keys() & set(preset.speed.models) - kept.keys():
        log.warning("speed.json's %s was measured with another recipe than the preset's: measured again", name)
    return [m for m in preset.speed.models if m not in kept]


def measure_speed(preset: Preset, done: dict | None = None, on_model=None) -> dict:
    """{model: {"recipe", "layer_kinds", "train": [per T], "decode": {context: ...}, "cache_bytes": {context:
    bytes}}} for the preset's speed models; `on_model(results)` after each model measured (run.py saves them, so a
    restart resumes); models of `done` with the preset's recipe are kept, not measured."""
    speed, results = preset.speed, reusable(preset, done)
    for name in tqdm([m for m in speed.models if m not in results], desc="speed", unit="model"):
        cfg = compose_config(entry_overrides(name, preset))
        B = lambda T: speed.tokens_per_step // T
        results[name] = {
            "recipe": speed_recipe(name, preset),
            "layer_kinds": make_lm_config(cfg.model, VOCAB).layer_kinds,
            "train": [train_step_time(cfg, T, B(T), speed.repeats, preset.peak_flops) for T in speed.lengths],
            "decode": decode_time(cfg, speed.decode_contexts, speed.decode_tokens, speed.repeats),
            "cache_bytes": {str(L): lm_cache_bytes(cfg, L) for L in sorted({*CACHE_CONTEXTS, *speed.decode_contexts})},
        }
        if on_model is not None:
            on_model(results)
    return results
