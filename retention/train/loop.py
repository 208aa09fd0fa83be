"""The training loop: build from a validated Config, resume from the newest good checkpoint, train with
prefetched batches and one compiled step, log to TensorBoard, evaluate at the training length and longer ones,
and write `summary.json` in the run folder.

Batch i of the training stream is a function of (seed, i), so a run resumed at step s sees exactly the batches
an uninterrupted run would. SIGTERM or SIGINT saves a checkpoint after the current step and exits with
128 + the signal number; a non-finite loss stops the run (NonFiniteLoss) without writing a checkpoint.

The same loop runs on one device or many (retention/parallel): it joins a multi-host job when there is one,
builds the `mesh` config's (data, fsdp, sequence) mesh over all devices, makes the state FSDP-sharded and feeds
batches split over it; checkpoints restore onto the current mesh whichever wrote them.
"""

import dataclasses
import functools
import json
import logging
import math
import os
import signal
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx
from tqdm import tqdm

from retention.data import prefetch
from retention.nn import LM, LMConfig, cache_bytes
from retention.parallel import (
    batch_sharding,
    check_batch,
    initialize_distributed,
    make_mesh,
    put_batch,
    state_shardings,
)
from retention.train.checkpoint import Checkpoints
from retention.train.config import Config, build
from retention.train.metrics import MetricsWriter, throughput, training_flops_per_token
from retention.train.optimizer import make_optimizer
from retention.train.step import TraceCount, make_eval_step, make_init, make_train_step, ratios

log = logging.getLogger(__name__)


class NonFiniteLoss(FloatingPointError):
    """The training loss, or the parameters about to be checkpointed, became NaN or inf."""


class StopSignals:
    """Within the block, SIGTERM and SIGINT only record their number in `.signum` (the loop saves, then exits)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __enter__(self):
        self.signum = None
        self.previous = {s: signal.signal(s, self._record) for s in self.SIGNALS}
        return self

    def _record(self, signum, frame):
        self.signum = signum

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def model_cache_bytes(model: LM, length: int) -> int:
    """Bytes of one sequence's decode caches at `length` tokens (shapes only, nothing allocated)."""
    return cache_bytes(jax.eval_shape(lambda: model.init_caches(1, length)))


def eval_sets(cfg: Config, dataset, seq_len: int) -> dict:
    """name -> function of a batch index giving an eval batch at seq_len (passkey: also one set per depth)."""
    sets = {"": lambda i: dataset.batch(i, seq_len=seq_len, split="eval")}
    if cfg.data.task == "passkey":
        for depth in dataset.depths:
            sets[f"depth{depth:g}/"] = lambda i, d=depth: dataset.batch(i, seq_len=seq_len, split="eval", depth=d)
    return sets


def evaluate(eval_step, params, cfg: Config, dataset, seq_len: int, put=jnp.asarray) -> dict[str, float]:
    """loss, accuracy, exact_match over trainer.eval_batches eval batches at seq_len (keys prefixed per set);
    `put` places a host batch on the devices."""
    out = {}
    for name, make_batch in eval_sets(cfg, dataset, seq_len).items():
        total = None
        for i in range(cfg.trainer.eval_batches):
            b = make_batch(i)
            sums = eval_step(params, put(b.inputs), put(b.targets))
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
        out.update({name + k: v for k, v in ratios(total).items()})
    return out


def hparams_of(cfg: Config, lm: LMConfig, n_params: int) -> dict:
    """The flat hyperparameters shown in TensorBoard's HParams tab."""
    flat = {
        f"{group}.{k}": v
        for group in ("model", "data", "optim", "trainer", "mesh")
        for k, v in dataclasses.asdict(getattr(cfg, group)).items()
    }
    return {**flat, "data.task": cfg.data.task, "model.d_model": lm.d_model, "seed": cfg.seed, "params": n_params}


def train(cfg: Config, run_dir: str) -> dict:
    """Train per `cfg` with everything written under `run_dir`; returns (and writes) the run's summary."""
    initialize_distributed(cfg.mesh.coordinator_address, cfg.mesh.num_processes, cfg.mesh.process_id)
    lm, dataset = build(cfg)
    T, B = cfg.data.seq_len, cfg.data.batch_size
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.sequence)
    check_batch(B, T, mesh)
    abstract_model = nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(cfg.seed)))  # shapes only
    n_params = abstract_model.param_count()
    eval_lengths = [s * T for s in cfg.trainer.eval_scales]
    caches = {L: model_cache_bytes(abstract_model, L) for L in (*eval_lengths, cfg.trainer.cache_len)}
    graphdef = nnx.graphdef(abstract_model)
    tx, schedule = make_optimizer(cfg.optim, cfg.trainer.steps)

    init_state = make_init(lm, tx, cfg.seed)
    abstract_state = jax.eval_shape(init_state)
    shardings = state_shardings(abstract_state, mesh)  # FSDP: each leaf over "fsdp" on its largest axis
    put = functools.partial(put_batch, sharding=batch_sharding(mesh))

    ckpt = Checkpoints(os.path.join(run_dir, "checkpoints"), every=cfg.trainer.ckpt_every, keep=cfg.trainer.keep)
    restored = ckpt.restore_latest(abstract_state, shardings)  # onto this mesh, whichever mesh wrote it
    if restored is not None:
        start, state = restored
        log.info("resumed from the checkpoint at step %d in %s", start, ckpt.directory)
    else:
        start, state = 0, jax.jit(init_state, out_shardings=shardings)()  # made in place, shard by shard
    primary = jax.process_index() == 0  # one process writes the events and the summary
    writer = MetricsWriter(os.path.join(run_dir, "tb"), purge_step=start, enabled=primary)
    writer.scalars(start, {"params": n_params, **{f"cache_bytes/{L}": b for L, b in caches.items()}}, "model")
    log.info(
        "%s: pattern %s x %d layers, d_model %d, %d params; %s T=%d B=%d; steps %d..%d; mesh %s",
        cfg.model.name,
        lm.pattern,
        lm.n_layers,
        lm.d_model,
        n_params,
        cfg.data.task,
        T,
        B,
        start,
        cfg.trainer.steps,
        dict(mesh.shape),
    )

    traces = TraceCount()
    train_step = make_train_step(
        graphdef, tx, traces, mesh=mesh, state_shardings=shardings, batch_sharding=batch_sharding(mesh)
    )
    eval_step = make_eval_step(graphdef, mesh=mesh)
    flops_tok = training_flops_per_token(lm, T)
    step_times, window, losses = [], [], {}
    batches = prefetch(dataset.batch, start, cfg.trainer.steps, size=cfg.data.prefetch)
    bar = tqdm(
        total=cfg.trainer.steps, initial=start, disable=not cfg.trainer.progress, unit="step", dynamic_ncols=True
    )
    try:
        with StopSignals() as stop:
            for step, batch in enumerate(batches, start=start):
                t0 = time.perf_counter()
                state, metrics = train_step(state, put(batch.inputs), put(batch.targets))
                metrics = {k: float(v) for k, v in metrics.items()}
                seconds = time.perf_counter() - t0
                done = step + 1
                try:
                    if not math.isfinite(metrics["loss"]):
                        raise FloatingPointError(f"the loss is {metrics['loss']} at step {done}")
                    ckpt.save(done, state)  # refuses parameters with NaN or inf
                except FloatingPointError as e:
                    raise NonFiniteLoss(
                        f"{e}: stopped; the last good checkpoint is step "
                        f"{ckpt.manager.latest_step()} in {ckpt.directory}"
                    ) from None
                if step > start:  # the first step of a process includes compilation
                    step_times.append(seconds)
                window.append(metrics)
                losses.setdefault("initial_loss", metrics["loss"])
                perf = throughput(B * T, seconds, flops_tok, cfg.trainer.peak_flops)
                bar.update(1)
                bar.set_postfix(loss=f"{metrics['loss']:.3f}", tok_s=f"{perf['tokens_per_s']:.0f}")
                if done % cfg.trainer.log_every == 0 or done == cfg.trainer.steps:
                    mean = {k: statistics.fmean(m[k] for m in window) for k in window[0]}
                    losses["train_loss"] = mean["loss"]
                    writer.scalars(done, {**mean, "lr": float(schedule(step))}, "train")
                    writer.scalars(done, {**perf, "step_time_s": seconds}, "perf")
                    log.info(
                        "step %d: loss %.4f accuracy %.3f grad_norm %.3f %.0f tok/s",
                        done,
                        mean["loss"],
                        mean["accuracy"],
                        mean["grad_norm"],
                        perf["tokens_per_s"],
                    )
                    window = []
                if cfg.trainer.eval_every and done % cfg.trainer.eval_every == 0 and done < cfg.trainer.steps:
                    for L in eval_lengths:
                        writer.scalars(done, evaluate(eval_step, state["params"], cfg, dataset, L, put), f"eval_{L}")
                if stop.signum is not None:
                    ckpt.save(done, state, force=True)
                    log.warning(
                        "signal %d: saved the checkpoint at step %d in %s; exiting", stop.signum, done, ckpt.directory
                    )
                    raise SystemExit(128 + stop.signum)
        ckpt.save(cfg.trainer.steps, state, force=True)
    finally:
        bar.close()
        batches.close()
        ckpt.close()
    if traces.count > 1:
        log.error(
            "the train step was traced %d times: a retrace (changing shapes, dtypes or static args)", traces.count
        )

    evals = {L: evaluate(eval_step, state["params"], cfg, dataset, L, put) for L in eval_lengths}
    for L, values in evals.items():
        writer.scalars(cfg.trainer.steps, values, f"eval_{L}")
    tokens_per_s = B * T / statistics.median(step_times) if step_times else float("nan")
    perf = throughput(B * T, B * T / tokens_per_s, flops_tok, cfg.trainer.peak_flops)
    summary = {
        "model": cfg.model.name,
        "pattern": lm.pattern,
        "n_layers": lm.n_layers,
        "d_model": lm.d_model,
        "layer_kinds": lm.layer_kinds,
        "params": n_params,
        "task": cfg.data.task,
        "seq_len": T,
        "steps": cfg.trainer.steps,
        "final_loss": evals[eval_lengths[0]]["loss"],
        "eval": {str(L): v for L, v in evals.items()},
        "cache_bytes": {str(L): b for L, b in caches.items()},
        "train_traces": traces.count,
        **losses,
        **perf,
    }
    writer.hparams(
        hparams_of(cfg, lm, n_params), {f"eval_{L}/{k}": v for L, values in evals.items() for k, v in values.items()}
    )
    writer.close()
    if primary:
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
    log.info("summary: %s", json.dumps(summary))
    return summary
