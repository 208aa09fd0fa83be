"""The training loop: build from a validated Config, lock the run folder, resume from the newest good checkpoint
of the same run, train with prefetched batches and one ahead-of-time compiled step, log to TensorBoard, evaluate
at the training length and longer ones, and write `summary.json` in the run folder.

Batch i of the training stream is a function of (seed, i), so a run resumed at step s sees exactly the batches
an uninterrupted run would. A run folder holds one run (retention/train/record.py): resuming it with another
model, data, optimizer or seed, or with trainer.steps below its newest checkpoint, stops before any work.
SIGTERM, SIGINT or SIGUSR2 saves a checkpoint after the current step and exits with 128 + the signal number
(retention/train/signals.py); a non-finite loss stops the run (NonFiniteLoss) without writing a checkpoint.
With trainer.early_stop.patience > 0 the run stops, with a checkpoint, at the eval where the convergence rule
says it has converged (retention/train/convergence.py); every checkpoint keeps the eval history, so a resumed run
counts on from it, and a converged run resumed again trains no further. summary.json says why the run stopped
(`stop_reason`: "converged" or "steps", the cap), at which step, and where its eval curve crossed 0.5 and 0.9 of
its final value.

With init_from the run starts from an existing model, converted by init_convert, with frozen parameters and
distillation from it (retention/train/init_from.py, retention/train/distill.py).

The same loop runs on one device or many (retention/parallel): it joins a multi-host job when there is one,
builds the `mesh` config's (data, fsdp, sequence, tensor) mesh over all devices, places the state and splits the
batches by the config's logical-axis rules (`mesh.rules`); checkpoints restore onto the current mesh whichever
wrote them.

Run folder: run.json (the run record, and `started_over`: each time every checkpoint was found damaged and the
run started over from step 0), train.lock, checkpoints/<step>/, checkpoints_damaged/ (only when a
checkpoint was found damaged), tb/ (TensorBoard events: one run), summary.json (when the run finished),
loss_by_position.png (a text run: the loss by position at the latest eval, retention/train/position_plot.py).
"""

import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx

from retention.data import Dataset, prefetch
from retention.nn import LM, cache_bytes
from retention.parallel import (
    batch_sharding,
    check_batch,
    check_heads_split,
    check_rules,
    initialize_distributed,
    make_mesh,
    put_batch,
    state_shardings,
)
from retention.train.checkpoint import Checkpoints
from retention.train.config import Config, ModelConfig, build
from retention.train.convergence import DEFAULT_METRIC, EvalHistory
from retention.train.distill import Distill
from retention.train.evaluate import evaluate_scales
from retention.train.hparams import metric_tags, run_hparams
from retention.train.init_from import Start, check_start, freeze, frozen_labels, start_model
from retention.train.lock import RunLock
from retention.train.metrics import MetricsWriter, training_flops_per_token
from retention.train.optimizer import make_optimizer
from retention.train.position_plot import PositionPlot
from retention.train.progress import Progress, StepDisplay
from retention.train.record import (
    RECORD_FILE,
    check_same_run,
    finite_json,
    read_record,
    run_record,
    write_json,
    write_text,
)
from retention.train.signals import StopSignals
from retention.train.step import TraceCount, device_batch, make_eval_step, make_init, make_train_step

log = logging.getLogger(__name__)


class NonFiniteLoss(FloatingPointError):
    """The training loss, or the parameters about to be checkpointed, became NaN or inf."""


def model_cache_bytes(model: LM, length: int) -> int:
    """Bytes of one sequence's decode caches at `length` tokens (shapes only, nothing allocated)."""
    return cache_bytes(jax.eval_shape(lambda: model.init_caches(1, length)))


def train(cfg: Config, run_dir: str, *, hparams: dict | None = None, files: dict[str, str] | None = None) -> dict:
    """Train per `cfg` with everything written under `run_dir`; returns (and writes) the run's summary.
    `hparams`: more HParams keys (train.py passes the command line's overrides, a sweep's varied keys).
    `files`: {path inside run_dir: text} written once the run holds the folder's lock and is the folder's run
    (train.py's .hydra/ files), so a refused launch changes none of them."""
    initialize_distributed(cfg.mesh.coordinator_address, cfg.mesh.num_processes, cfg.mesh.process_id)
    lm, dataset = build(cfg, run_dir)
    origin = start_model(cfg, ModelConfig(), dataset.vocab_size) if cfg.init_from is not None else None
    if origin is not None:
        lm = origin.model.config
        check_start(cfg, lm)
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.sequence, cfg.mesh.tensor)
    rules = check_rules(cfg.mesh.rules)
    check_batch(cfg.data.batch_size, cfg.data.seq_len, mesh, rules=rules)
    check_heads_split(lm.n_heads, lm.n_kv_heads, mesh, rules)
    lock = "train.lock" if jax.process_count() == 1 else f"train.{jax.process_index()}.lock"
    with RunLock(run_dir, lock):
        return _train(cfg, run_dir, lm, dataset, mesh, rules, hparams or {}, files or {}, origin)


@dataclasses.dataclass
class Session:
    """What the steps of one run share: its config and data, checkpoints, TensorBoard writer and bookkeeping."""

    cfg: Config
    dataset: Dataset
    put: Callable  # a host array -> the global batch array over the mesh
    ckpt: Checkpoints
    writer: MetricsWriter
    progress: Progress
    schedule: Callable  # step -> learning rate
    eval_step: Callable
    history: EvalHistory  # the convergence rule's metric at each eval
    last_evals: tuple[int, dict] | None = None  # (step, evals) of the latest eval
    plot: PositionPlot | None = None  # the loss-by-position plot (None: a process that writes no files)

    def evaluate(self, step: int, params) -> dict[int, dict[str, float]]:
        """Evaluate at every eval scale and write each metric as eval/x{scale}/{name} at `step`, and a text run's
        loss by position as one plot; the rule's metric at the training length joins the eval history."""
        evals = evaluate_scales(self.eval_step, params, self.cfg, self.dataset, self.put)
        tokens = step * self.cfg.data.batch_size * self.cfg.data.seq_len
        for scale, values in evals.items():
            self.writer.scalars(step, values, f"eval/x{scale}", tokens=tokens)
        if self.plot is not None:
            self.plot.write(step, {s * self.cfg.data.seq_len: v for s, v in evals.items()}, self.writer)
        if 1 in evals:
            self.history.add(step, evals[1][self.history.metric])
        self.last_evals = step, evals
        return evals

    def final_evals(self, step: int, params) -> dict[int, dict[str, float]]:
        """The evals at `step`, the run's last: the loop's own when it evaluated there, else made now."""
        if self.last_evals is not None and self.last_evals[0] == step:
            return self.last_evals[1]
        return self.evaluate(step, params)

    def checkpoint_record(self) -> dict:
        """What a checkpoint keeps beside the state: the progress and the eval history."""
        return {**self.progress.record(), **self.history.record()}


def eval_history(cfg: Config, saved: dict) -> EvalHistory:
    """The run's eval history under trainer.early_stop's rule, continued from a checkpoint's record `saved`."""
    rule = cfg.trainer.early_stop
    metric = rule.metric or DEFAULT_METRIC[cfg.data.task]
    return EvalHistory(metric, rule.patience, rule.min_delta, rule.min_step, saved)


def _resume(ckpt: Checkpoints, cfg: Config, run_dir: str, abstract_state, shardings, record: dict, init_state, params):
    """(start step, state, saved progress, the steps of the damaged checkpoints it starts over without): the
    newest good checkpoint of this run, else a fresh state made in its shardings (`init_state(params)`).
    ValueError when trainer.steps is below the newest checkpoint; RunMismatch for another run's."""
    steps, listed = cfg.trainer.steps, ckpt.steps()
    if listed and listed[-1] > steps:
        raise ValueError(
            f"trainer.steps={steps} is below step {listed[-1]}, the newest checkpoint of the run in {run_dir}: a run "
            f"is never cut short. Continue it with trainer.steps >= {listed[-1]}, or train a shorter run in another "
            "folder (hydra.run.dir=...)"
        )
    check = lambda saved, where: check_same_run(saved, record, where)
    restored = ckpt.restore_latest(abstract_state, shardings, check_record=check)  # onto this mesh
    if restored is None:
        if listed:
            log.warning(
                "every checkpoint in %s (steps %s) is damaged and was moved to %s_damaged: the run starts over "
                "from step 0 (run.json records this under started_over)",
                *(ckpt.directory, listed, ckpt.directory),
            )
        return 0, jax.jit(init_state, out_shardings=shardings)(params), {}, listed
    log.info("resumed from the checkpoint at step %d in %s", restored.step, ckpt.directory)
    if (before := restored.record["config"]["trainer"]["steps"]) != steps:
        log.warning(
            "trainer.steps changed from %d to %d: the learning rate now decays over %d steps", before, steps, steps
        )
    return restored.step, restored.state, restored.progress, []


def _train(cfg: Config, run_dir: str, lm, dataset, mesh, rules, hparams: dict, files: dict[str, str], origin) -> dict:
    T, B, steps = cfg.data.seq_len, cfg.data.batch_size, cfg.trainer.steps
    abstract_model = nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(cfg.seed)))  # shapes only
    n_params = abstract_model.param_count()
    caches = {
        L: model_cache_bytes(abstract_model, L)
        for L in (*(s * T for s in cfg.trainer.eval_scales), cfg.trainer.cache_len)
    }
    graphdef = nnx.graphdef(abstract_model)
    tx, schedule = make_optimizer(cfg.optim, steps)
    initial = None if origin is None else nnx.state(origin.model)  # the run's first parameters (None: fresh)
    if cfg.freeze:
        tx = freeze(tx, frozen_labels(nnx.state(abstract_model), cfg.freeze, origin.converted if origin else ()))
    init_state = make_init(lm, tx, cfg.seed)
    abstract_state = jax.eval_shape(init_state, initial)
    shardings = state_shardings(abstract_state, mesh, rules)  # each leaf by its logical axes' rules
    primary = jax.process_index() == 0  # one process writes the record, the events and the summary
    fingerprints = dataset.fingerprints() if hasattr(dataset, "fingerprints") else None  # text: tokenizer, corpus
    record = run_record(cfg, lm, abstract_state["params"], fingerprints)
    saved = read_record(run_dir)
    if saved is not None:
        check_same_run(saved, record, run_dir)

    with contextlib.ExitStack() as stack:
        every, keep = cfg.trainer.ckpt_every, cfg.trainer.keep
        ckpt = Checkpoints(os.path.join(run_dir, "checkpoints"), every=every, keep=keep, record=record)
        stack.callback(ckpt.close)  # waits for the pending saves
        start, state, saved_progress, damaged = _resume(
            ckpt, cfg, run_dir, abstract_state, shardings, record, init_state, initial
        )
        started_over = (saved or {}).get("started_over", [])  # kept across restarts: the run's history
        if damaged:
            started_over = [*started_over, {"damaged_steps": damaged, "at": time.strftime("%Y-%m-%d %H:%M:%S")}]
        if primary:
            write_json(os.path.join(run_dir, RECORD_FILE), {**record, "started_over": started_over})
            for name, text in files.items():
                write_text(os.path.join(run_dir, name), text)
        writer = MetricsWriter(os.path.join(run_dir, "tb"), purge_step=start, enabled=primary)
        stack.callback(writer.close)
        writer.start_session(run_hparams(cfg, lm, n_params, hparams), metric_tags(cfg))
        cache_scalars = {f"cache_bytes/x{s}": caches[s * T] for s in cfg.trainer.eval_scales}
        cache_scalars[f"cache_bytes/{cfg.trainer.cache_len}"] = caches[cfg.trainer.cache_len]
        writer.scalars(start, {"params": n_params, **cache_scalars}, "model")
        log.info(
            "%s: pattern %s x %d layers, d_model %d, %d params; %s T=%d B=%d; steps %d..%d; mesh %s",
            *(cfg.model.name, lm.pattern, lm.n_layers, lm.d_model, n_params, cfg.data.task, T, B, start, steps),
            dict(mesh.shape),
        )
        batches = batch_sharding(mesh, rules)
        put = functools.partial(put_batch, sharding=batches)
        progress = Progress(B * T, training_flops_per_token(lm, T), cfg.trainer.peak_flops, saved_progress)
        history = eval_history(cfg, saved_progress)
        eval_step = make_eval_step(graphdef, mesh=mesh, rules=rules)
        plot = PositionPlot(run_dir, f"{cfg.model.name} ({lm.layer_kinds})") if primary else None
        session = Session(cfg, dataset, put, ckpt, writer, progress, schedule, eval_step, history, plot=plot)
        stopped = history.stopped_step()  # a run the rule stopped has nothing left to train
        traces, compile_s, final = TraceCount(), None, steps if stopped is None else max(stopped, start)
        if start < final:
            distill, teacher, teacher_shardings = _distillation(cfg, origin, mesh, rules)
            train_step = make_train_step(
                *(graphdef, tx, traces),
                mesh=mesh,
                state_shardings=shardings,
                batch_sharding=batches,
                rules=rules,
                distill=distill,
                teacher_shardings=teacher_shardings,
            )
            batch_shape = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batches),
                device_batch(dataset.batch(start), np.asarray),
            )
            t0 = time.perf_counter()
            compiled = train_step.lower(state, batch_shape, *teacher).compile()  # compile time apart from step time
            compile_s = time.perf_counter() - t0
            log.info("compiled the train step in %.1f s", compile_s)
            writer.scalars(start, {"compile_s": compile_s}, "perf")
            step_fn = compiled if not teacher else functools.partial(_with_teacher, compiled, teacher)
            state, final = _loop(session, step_fn, state, start)
        if traces.count > 1:
            log.error(
                "the train step was traced %d times: a retrace (changing shapes, dtypes or static args)", traces.count
            )
        evals = session.final_evals(final, state["params"])
        ckpt.wait()  # the summary says the run is done: its last checkpoint is on disk
        summary = {
            "model": cfg.model.name,
            "pattern": lm.pattern,
            "n_layers": lm.n_layers,
            "d_model": lm.d_model,
            "layer_kinds": lm.layer_kinds,
            "params": n_params,
            "task": cfg.data.task,
            "seq_len": T,
            "batch_size": B,
            "steps": final,
            "tokens_seen": final * B * T,
            **history.summary(steps),
            "resumed_from": start,
            "started_over": started_over,  # each start from step 0 because every checkpoint was damaged
            "final_loss": evals[cfg.trainer.eval_scales[0]]["loss"],
            "eval": {str(s * T): values for s, values in evals.items()},
            "eval_lengths": {f"x{s}": s * T for s in cfg.trainer.eval_scales},
            "cache_bytes": {str(L): b for L, b in caches.items()},
            "train_traces": traces.count,
            "compile_s": compile_s,
            "initial_loss": progress.initial_loss,
            "train_loss": progress.train_loss,
            **progress.perf(progress.tokens_per_s()),
        }
        summary = finite_json(summary)
        writer.end_session()
    if primary:
        write_json(os.path.join(run_dir, "summary.json"), summary)
    log.info("summary: %s", summary)
    return summary


def _distillation(cfg: Config, origin: Start | None, mesh, rules) -> tuple[Distill | None, tuple, object]:
    """(the train step's Distill, its extra arguments: the teacher's parameters placed on the mesh, or (), their
    shardings) for cfg.distill: none unless a weight is > 0 (the config check ties distill to init_from)."""
    d = cfg.distill
    if origin is None or not (d.kl_weight or d.layer_weight):
        return None, (), None
    graphdef, params = nnx.split(origin.teacher)
    placed = state_shardings(params, mesh, rules)
    distill = Distill(d.kl_weight, d.temperature, d.layer_weight, graphdef, origin.converted)
    return distill, (jax.device_put(params, placed),), placed


def _with_teacher(compiled, teacher: tuple, state, batch):
    """The compiled distillation step on (state, batch) with the teacher's parameters."""
    return compiled(state, batch, *teacher)


def _loop(session: Session, compiled, state, start: int):
    """Steps start+1 .. trainer.steps, or until the convergence rule stops the run; returns the final state and
    its step. Checkpoints on Orbax's policy, at a stop signal or preemption sync point (then exits), at the rule's
    stop and at the end."""
    cfg, ckpt, writer, progress = session.cfg, session.ckpt, session.writer, session.progress
    tokens_per_step, steps = cfg.data.batch_size * cfg.data.seq_len, cfg.trainer.steps
    batches = prefetch(session.dataset.batch, start, steps, size=cfg.data.prefetch)
    bar = StepDisplay(steps, start, cfg.trainer.progress)
    progress.restart_clock()
    try:  # no implicit device-to-host copy in the loop: only the log, eval and save points fetch, explicitly
        with StopSignals() as stop, jax.transfer_guard_device_to_host("disallow"):
            for step, batch in enumerate(batches, start=start):
                state, metrics = compiled(state, device_batch(batch, session.put))  # queued: nothing waits here
                done, tokens = step + 1, (step + 1) * tokens_per_step
                progress.pending.append(metrics)
                bar.queued(metrics["loss"])
                stopping = stop.signum is not None or ckpt.reached_preemption(done)
                if done % cfg.trainer.log_every == 0 or done == steps:
                    mean, perf = progress.log(done)
                    lr = float(jax.device_get(session.schedule(step)))
                    writer.scalars(done, {**mean, "lr": lr}, "train", tokens=tokens)
                    writer.scalars(done, {"tokens_seen": tokens}, "train")
                    writer.scalars(done, perf, "perf")
                    bar.arrived(loss=f"{mean['loss']:.3f}", tok_s=f"{perf['tokens_per_s']:.0f}")
                    log.info(
                        "step %d: loss %.4f accuracy %.3f grad_norm %.3f %.0f tok/s",
                        *(done, mean["loss"], mean["accuracy"], mean["grad_norm"], perf["tokens_per_s"]),
                    )
                converged = False
                if cfg.trainer.eval_every and done % cfg.trainer.eval_every == 0:  # before the save: its history
                    with progress.paused(state):
                        session.evaluate(done, state["params"])
                    converged = session.history.stopped_step() == done
                if stopping or converged or done == steps or ckpt.should_save(done):
                    with progress.paused(state):
                        progress.fetch(done)  # a NaN loss is never checkpointed
                        bar.arrived()
                        with jax.transfer_guard_device_to_host("allow"):  # Orbax copies the state to the host
                            ckpt.save(done, state, progress=session.checkpoint_record())  # refuses NaN or inf
                if stopping:
                    log.warning("stop requested: saved the checkpoint at step %d in %s; exiting", done, ckpt.directory)
                    stop.exit()
                if converged:
                    log.info("converged at step %d (trainer.early_stop): stopped before the cap %d", done, steps)
                    return state, done
    except FloatingPointError as e:
        latest = ckpt.steps()[-1] if ckpt.steps() else None
        raise NonFiniteLoss(f"{e}: stopped; the last good checkpoint is step {latest} in {ckpt.directory}") from None
    finally:
        bar.close()
        batches.close()
    return state, steps
