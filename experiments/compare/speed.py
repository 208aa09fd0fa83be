"""Speed and memory of the compared models: the trainer's own compiled train step at each length T with the same
tokens per step (batch = tokens_per_step // T), greedy decode ms per token after each context, and decode-cache
bytes per sequence. Medians of several repeats after a warm-up; random byte tokens (speed does not depend on
the data). Returns a dict that `run.py` writes as speed.json.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from experiments.compare.models import compose_config, lm_cache_bytes, model_overrides
from experiments.compare.presets import Preset
from experiments.decode_speed import ms_per_token
from experiments.timing import run_times
from retention.data import Batch
from retention.nn import LM
from retention.train.config import Config, make_lm_config
from retention.train.metrics import throughput, training_flops_per_token
from retention.train.optimizer import make_optimizer
from retention.train.step import TraceCount, device_batch, make_train_step

VOCAB = 256  # byte-level, as the text task
CACHE_CONTEXTS = tuple(1024 * 4**i for i in range(6))  # 1k .. 1M tokens: shapes only, nothing allocated


def train_step_time(cfg: Config, T: int, B: int, repeats: int, peak_flops: float) -> dict:
    """Median seconds of one compiled train step on [B, T] tokens after a warm-up step, its throughput, and the
    compiled step's temporary and argument bytes (XLA's memory analysis)."""
    lm = make_lm_config(cfg.model, VOCAB)
    graphdef, params = nnx.split(LM(lm, rngs=nnx.Rngs(cfg.seed)))
    tx, _ = make_optimizer(cfg.optim, 1000)
    state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}
    tokens = jax.random.randint(jax.random.key(T), (B, T + 1), 0, VOCAB, dtype=jnp.int32)
    batch = device_batch(Batch(tokens[:, :-1], tokens[:, 1:]))
    compiled = make_train_step(graphdef, tx, TraceCount()).lower(state, batch).compile()
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


def measure_speed(preset: Preset, window: int) -> dict:
    """{model: {"layer_kinds", "train": [per T], "decode": {context: ...}, "cache_bytes": {context: bytes}}}."""
    results = {}
    jobs = [(name, T) for name in preset.models for T in preset.speed_lengths]
    bar = tqdm(jobs, desc="train-step speed", unit="run")
    for name, T in bar:
        bar.set_postfix(model=name, T=T)
        cfg = compose_config(model_overrides(name, preset, window))
        entry = results.setdefault(name, {"train": [], "decode": {}, "cache_bytes": {}})
        entry["layer_kinds"] = make_lm_config(cfg.model, VOCAB).layer_kinds
        B = preset.tokens_per_step // T
        entry["train"].append(train_step_time(cfg, T, B, preset.speed_repeats, preset.peak_flops))
    for name in tqdm(preset.models, desc="decode speed", unit="model"):
        cfg = compose_config(model_overrides(name, preset, window))
        results[name]["decode"] = decode_time(cfg, preset.decode_contexts, preset.decode_tokens, preset.speed_repeats)
        contexts = sorted({*CACHE_CONTEXTS, *preset.decode_contexts})
        results[name]["cache_bytes"] = {str(L): lm_cache_bytes(cfg, L, VOCAB) for L in contexts}
    return results
