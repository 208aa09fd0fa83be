"""The test evaluation of a finished run: its metrics at each test length on draws the learning-rate choice never
saw (eval-split batches from TEST_OFFSET on). The task's multiples of the training length run through the full
forward; a long length through a prefill and decode steps of `long_chunk` tokens that carry every layer's cache
(memory bounded by the chunk), drawing batches until it has read the task's `long_min_queries` labelled targets;
a quantized-cache entry through decode steps against that cache, and a quantized-state entry token by token with
every recurrent state re-quantized after every token (`round_trip_states`, as `generate(..., state_format=...)`).
A length whose compiled eval needs more memory than the preset allows (XLA's memory analysis of the compiled
program) or that the preset leaves out is marked, not run.
"""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.compare.presets import TEST_OFFSET, Preset
from experiments.compare.protocol import Run
from experiments.compare.runs import SUMMARY, eval_sums, load_params, read_json
from experiments.formatting import human_bytes
from retention.nn import LM
from retention.serve.quantized_state import QuantizedArray, quantize_caches, round_trip_states
from retention.train.config import Config, make_dataset, make_lm_config
from retention.train.evaluate import bits_per_byte, target_bytes
from retention.train.step import ratios, token_scores


def test_lengths(preset: Preset, run: Run, seq_len: int) -> list[int]:
    """The run's test lengths: the task's multiples of its training length, then its long lengths beyond them
    (a quantized-cache or quantized-state entry: the multiples only, where the frontier is read)."""
    spec = preset.tasks[run.task]
    lengths = [s * seq_len for s in spec.test_scales]
    if preset.entries[run.entry].trained:
        lengths += [L for L in spec.long_lengths if L > max(lengths)]
    return lengths


def long_skip_note(preset: Preset, entry: str) -> str | None:
    """What a long length of `entry` says when the preset leaves it out there ("not run: <reason>"), or None."""
    reason = preset.long_eval_skip.get(entry)
    return None if reason is None else f"not run: {reason}"


def stale_lengths(preset: Preset, run: Run, done: dict, seq_len: int) -> list[int]:
    """The long lengths a finished test eval must run again because the preset now reads them otherwise.

    Args:
        preset: the comparison's preset.
        run: the evaluated run.
        done: its test.json ({str(length): metrics or {"skipped": why}}).
        seq_len: its training length.

    Returns:
        Each long length of the run that `done` lacks, that the preset now leaves out and `done` holds measured,
        that `done` left out for a reason other than memory (or other than the preset's own), or that read fewer
        labelled targets than the task's long_min_queries (a result without a count: none).
    """
    spec, note = preset.tasks[run.task], long_skip_note(preset, run.entry)

    def stale(result: dict | None) -> bool:
        if result is None or note is not None:
            return result is None or result.get("skipped") != note
        if "skipped" in result:
            return not result["skipped"].startswith("not run: memory")
        return result.get("queries", 0) < spec.long_min_queries

    long = [L for L in test_lengths(preset, run, seq_len) if L > max(spec.test_scales) * seq_len]
    return [L for L in long if stale(done.get(str(L)))]


def _add(total, sums):
    return sums if total is None else jax.tree.map(jnp.add, total, sums)


def _step_sums(logits_BcV, targets_Bc) -> tuple[dict, tuple]:
    """One step's scores (`token_scores`): each row's nll, correct and labels [B] (a row's exact match is known only
    once all its steps are summed: `_whole_rows`), and each position's nll and labels summed over the rows [c]."""
    nll_Bc, correct_Bc, mask_Bc = token_scores(logits_BcV, targets_Bc)
    f32 = jnp.float32
    rows = {"nll": nll_Bc.sum(1), "correct": correct_Bc.sum(1, dtype=f32), "labels": mask_Bc.sum(1, dtype=f32)}
    return rows, (nll_Bc.sum(0), mask_Bc.sum(0, dtype=f32))


def _whole_rows(sums: dict) -> dict:
    """The scalar sums (SCALAR_SUMS) from each row's sums over all its steps: a row with a label is exact when
    every label is right."""
    has_label_B = sums["labels"] > 0
    exact_B = has_label_B & (sums["correct"] == sums["labels"])
    f32 = lambda x: jnp.sum(x, dtype=jnp.float32)
    out = {k: f32(sums[k]) for k in ("nll", "correct", "labels")}
    return {**out, "exact": f32(exact_B), "rows": f32(has_label_B)}


@partial(jax.jit, static_argnames=("graphdef",))
def _forward_sums(graphdef, params, inputs_BT, targets_BT):
    return eval_sums(nnx.merge(graphdef, params), inputs_BT, targets_BT)


def program_bytes(compiled) -> int:
    """XLA's estimate of a compiled program's memory: its temporaries, arguments and output, in bytes."""
    memory = compiled.memory_analysis()
    return memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes


def compiled_forward(graphdef, params, batch: int, L: int):
    """The full-forward eval sums (`eval_sums`) compiled for [batch, L] tokens, and XLA's estimate of its memory.

    Args:
        graphdef: the model's graph (static).
        params: its parameters (an nnx.State, or their ShapeDtypeStructs).
        batch: rows per call.
        L: tokens per row.

    Returns:
        (compiled(params, inputs_BT, targets_BT) -> masked sums, its bytes: `program_bytes`).
    """
    tokens = jax.ShapeDtypeStruct((batch, L), jnp.int32)
    compiled = _forward_sums.lower(graphdef, params, tokens, tokens).compile()
    return compiled, program_bytes(compiled)


@partial(jax.jit, static_argnames=("graphdef", "chunk", "state_format"))
def _decode_sums(graphdef, params, inputs_BT, targets_BT, *, chunk: int, state_format):
    """`decode_sums` in one compiled program: the prefill, then a scan of the full decode steps, then a last
    shorter step when `chunk` does not divide the rest; each row's sums carried to the end."""
    model = nnx.merge(graphdef, params)
    B, L = inputs_BT.shape
    chunk = min(chunk, L)
    requantize = (lambda c: c) if state_format is None else (lambda c: round_trip_states(c, state_format))
    logits, caches = model.prefill(inputs_BT[:, :chunk], L, step_tokens=chunk)
    total, first = _step_sums(logits, targets_BT[:, :chunk])

    def step(carry, xy_2Bc):
        caches, total = carry
        logits, caches = model.decode_step(xy_2Bc[0], requantize(caches))
        rows, positions = _step_sums(logits, xy_2Bc[1])
        return (caches, _add(total, rows)), positions

    steps = (L - chunk) // chunk
    end = chunk + steps * chunk
    to_steps = lambda x_BT: x_BT[:, chunk:end].reshape(B, steps, chunk).swapaxes(0, 1)  # [steps, B, chunk]
    xy_N2Bc = jnp.stack([to_steps(inputs_BT), to_steps(targets_BT)], axis=1)
    (caches, total), (nll_Nc, labels_Nc) = jax.lax.scan(step, (caches, total), xy_N2Bc)
    parts = [first, (nll_Nc.reshape(-1), labels_Nc.reshape(-1))]
    if end < L:
        (_, total), last = step((caches, total), jnp.stack([inputs_BT[:, end:], targets_BT[:, end:]]))
        parts.append(last)
    nll_T, labels_T = (jnp.concatenate(p) for p in zip(*parts))
    return {**_whole_rows(total), "nll_T": nll_T, "labels_T": labels_T}


def decode_sums(model: LM, inputs_BT, targets_BT, chunk: int, state_format=None) -> dict:
    """Masked sums of a batch run as a prefill of its first `chunk` tokens then decode steps of `chunk` tokens,
    each reading the caches the one before left (a quantized KV cache, when the model has one), so memory is that
    of one chunk (and the caches), not of the whole length.

    Args:
        model: the LM.
        inputs_BT: token ids [B, L].
        targets_BT: targets [B, L] (IGNORE where unlabelled).
        chunk: tokens per step (the last step may be shorter).
        state_format: None, or one of retention.serve's STATE_FORMATS: every recurrent state re-quantized per row
            (`round_trip_states`) after the prefill and after every step, as `generate(..., state_format=...)`
            does; with chunk 1, after every token.

    Returns:
        The masked sums of `eval_sums` over the batch: the scalar ones (retention.train.step.SCALAR_SUMS, a row's
        exact match over its whole length) and each position's nll_T and labels_T [L].
    """
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise ValueError(f"chunk must be an int >= 1 (tokens per decode step), got {chunk!r}")
    graphdef, params = nnx.split(model)
    return _decode_sums(graphdef, params, inputs_BT, targets_BT, chunk=chunk, state_format=state_format)


def check_quantized_states(entry: str, model: LM, state_format) -> None:
    """Refuse a quantized-state eval of a model with no recurrent state that `quantize_caches` stores quantized
    (only P, D, G and M layers have one): it would be the float eval under another name.

    Args:
        entry: the entry's name (for the message).
        model: its base's LM.
        state_format: one of retention.serve's STATE_FORMATS.

    Raises:
        ValueError: naming the entry, the format and the model's layers, when no state would be quantized.
    """
    is_quantized = lambda x: isinstance(x, QuantizedArray)
    caches = jax.eval_shape(lambda: quantize_caches(model.init_caches(1, 1), state_format))
    if not any(is_quantized(x) for x in jax.tree.leaves(caches, is_leaf=is_quantized)):
        kinds = "".join(model.config.layer_kinds)
        raise ValueError(
            f"entry {entry!r} has state_format={state_format!r}, but its model's layers ({kinds}) hold no "
            "recurrent state to quantize (P, D, G and M layers do)"
        )


def _compile(preset: Preset, run: Run, graphdef, params, tokens, long: bool):
    """The run's eval program at one length, compiled for `tokens`' shape: (params, inputs, targets) -> sums."""
    entry, spec = preset.entries[run.entry], preset.tasks[run.task]
    if entry.trained and not long:
        return compiled_forward(graphdef, params, *tokens.shape)[0]
    if entry.state_format is not None:  # token by token: re-quantized after every token
        check_quantized_states(run.entry, nnx.merge(graphdef, params), entry.state_code)
        options = {"chunk": 1, "state_format": entry.state_code}
    else:
        options = {"chunk": spec.long_chunk if entry.trained else spec.decode_chunk, "state_format": None}
    return _decode_sums.lower(graphdef, params, tokens, tokens, **options).compile()


def _length_metrics(preset: Preset, run: Run, cfg: Config, graphdef, params, L: int) -> dict:
    """The metrics at length L over the task's test batches (at a long length, as many more as its
    `long_min_queries` asks), or {"skipped": why}."""
    spec = preset.tasks[run.task]
    long = L > max(spec.test_scales) * cfg.data.seq_len
    if long and (note := long_skip_note(preset, run.entry)) is not None:
        return {"skipped": note}
    batch = max(1, spec.test_tokens // L)
    data = make_dataset(dataclasses.replace(cfg.data, batch_size=batch), cfg.seed)
    compiled = _compile(preset, run, graphdef, params, jax.ShapeDtypeStruct((batch, L), jnp.int32), long)
    nbytes = program_bytes(compiled)
    if nbytes > preset.long_eval_bytes:
        return {"skipped": f"not run: memory {human_bytes(nbytes)} > {human_bytes(preset.long_eval_bytes)}"}
    min_queries = spec.long_min_queries if long else 0
    total, batches = None, []
    while len(batches) < spec.test_batches or float(total["labels"]) < min_queries:
        b = data.batch(TEST_OFFSET + len(batches), seq_len=L, split="eval")
        sums = compiled(params, jnp.asarray(b.inputs), jnp.asarray(b.targets))
        if float(sums["labels"]) == 0 and min_queries:
            raise ValueError(
                f"task {run.task!r}: a test batch at L={L} has no labelled target, so long_min_queries="
                f"{min_queries} is never reached (set it to 0 for a task without queries)"
            )
        total = _add(total, sums)
        batches.append(b)
    out = {**ratios(total), "sequences": batch * len(batches), "queries": int(total["labels"]), "eval_bytes": nbytes}
    if hasattr(data, "token_bytes"):  # text: bits per byte, comparable across tokenizers (as the trainer's eval)
        n_bytes = sum(target_bytes(b.targets, data.token_bytes) for b in batches)
        out["bits_per_byte"] = bits_per_byte(float(total["nll"]), n_bytes)
    return out


def evaluate_run(preset: Preset, run: Run, cfg: Config, source, lengths: list[int] | None = None) -> dict[str, dict]:
    """The test eval of the finished run in the folder `source` (its last step: the convergence rule's stop, or
    the cap).

    Args:
        preset: the comparison's preset.
        run: the run (a quantized entry's: its base's runs are in `source`).
        cfg: the run's trainer Config.
        source: the trained run's folder.
        lengths: the test lengths to evaluate (None: every test length of the run).

    Returns:
        {str(length): metrics (and the compiled eval's bytes, sequences and labelled targets read), or
        {"skipped": why}}.
    """
    lm = make_lm_config(cfg.model, make_dataset(cfg.data, cfg.seed).vocab_size)
    params = load_params(source, read_json(source / SUMMARY)["steps"])
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(0))))
    lengths = test_lengths(preset, run, cfg.data.seq_len) if lengths is None else lengths
    return {str(L): _length_metrics(preset, run, cfg, graphdef, params, L) for L in lengths}
