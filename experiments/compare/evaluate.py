"""The test evaluation of a finished run: its metrics at each test length on draws the learning-rate choice never
saw (eval-split batches from TEST_OFFSET on), through the full forward or, for a quantized-cache entry, through
prefill and decode steps against that cache. A length whose compiled eval needs more memory than the preset
allows (XLA's memory analysis of the compiled program) or that the preset leaves out is marked, not run.
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
from retention.train.config import Config, make_dataset, make_lm_config
from retention.train.evaluate import bits_per_byte, target_bytes
from retention.train.step import ratios, score_sums, token_scores


def test_lengths(preset: Preset, run: Run, seq_len: int) -> list[int]:
    """The run's test lengths: the task's multiples of its training length, then its long lengths beyond them
    (a quantized-cache entry: the multiples only, where the frontier is read)."""
    spec = preset.tasks[run.task]
    lengths = [s * seq_len for s in spec.test_scales]
    if preset.entries[run.entry].trained:
        lengths += [L for L in spec.long_lengths if L > max(lengths)]
    return lengths


def _add(total, sums):
    return sums if total is None else jax.tree.map(jnp.add, total, sums)


@partial(jax.jit, static_argnames=("graphdef",))
def _forward_sums(graphdef, params, inputs_BT, targets_BT):
    return eval_sums(nnx.merge(graphdef, params), inputs_BT, targets_BT)


def compiled_forward(graphdef, params, batch: int, L: int):
    """The full-forward eval sums (`eval_sums`) compiled for [batch, L] tokens, and XLA's estimate of its memory.

    Args:
        graphdef: the model's graph (static).
        params: its parameters (an nnx.State, or their ShapeDtypeStructs).
        batch: rows per call.
        L: tokens per row.

    Returns:
        (compiled(params, inputs_BT, targets_BT) -> masked sums, its bytes: temporaries + arguments + output).
    """
    tokens = jax.ShapeDtypeStruct((batch, L), jnp.int32)
    compiled = _forward_sums.lower(graphdef, params, tokens, tokens).compile()
    memory = compiled.memory_analysis()
    return compiled, memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes


_token_scores, _score_sums = jax.jit(token_scores), jax.jit(score_sums)


def decode_sums(model: LM, inputs_BT, targets_BT, chunk: int) -> dict:
    """The masked sums of `eval_sums` (per-position ones included) of a batch run as a prefill of its first `chunk`
    tokens then decode steps of `chunk` tokens, so every later token reads the caches carried from the tokens
    before it: the model's decode caches (a quantized KV cache, when the model has one; a fixed-size state for the
    recurrent layers). Each step's token scores are joined along T before they are summed, so a row's exact match
    is over the whole row."""
    L = inputs_BT.shape[1]
    chunk = min(chunk, L)
    logits, caches = model.prefill(inputs_BT[:, :chunk], L, step_tokens=chunk)
    scores = [_token_scores(logits, targets_BT[:, :chunk])]
    for t in range(chunk, L, chunk):
        logits, caches = model.decode_step(inputs_BT[:, t : t + chunk], caches)
        scores.append(_token_scores(logits, targets_BT[:, t : t + chunk]))
    return _score_sums(*(jnp.concatenate(parts, axis=1) for parts in zip(*scores)))


def _length_metrics(preset: Preset, run: Run, cfg: Config, graphdef, params, L: int) -> dict:
    """The metrics at length L over the task's test batches, or {"skipped": why}."""
    spec = preset.tasks[run.task]
    if L > max(spec.test_scales) * cfg.data.seq_len and run.entry in preset.long_eval_skip:
        return {"skipped": f"not run: {preset.long_eval_skip[run.entry]}"}
    batch = max(1, spec.test_tokens // L)
    data = make_dataset(dataclasses.replace(cfg.data, batch_size=batch), cfg.seed)
    batches = [data.batch(TEST_OFFSET + i, seq_len=L, split="eval") for i in range(spec.test_batches)]
    total, nbytes = None, None
    if not preset.entries[run.entry].trained:
        model = nnx.merge(graphdef, params)
        for b in batches:
            total = _add(total, decode_sums(model, jnp.asarray(b.inputs), jnp.asarray(b.targets), spec.decode_chunk))
    else:
        compiled, nbytes = compiled_forward(graphdef, params, batch, L)
        if nbytes > preset.long_eval_bytes:
            return {"skipped": f"not run: memory {human_bytes(nbytes)} > {human_bytes(preset.long_eval_bytes)}"}
        for b in batches:
            total = _add(total, compiled(params, jnp.asarray(b.inputs), jnp.asarray(b.targets)))
    out = {**ratios(total), "sequences": batch * spec.test_batches, "eval_bytes": nbytes}
    if hasattr(data, "token_bytes"):  # text: bits per byte, comparable across tokenizers (as the trainer's eval)
        n_bytes = sum(target_bytes(b.targets, data.token_bytes) for b in batches)
        out["bits_per_byte"] = bits_per_byte(float(total["nll"]), n_bytes)
    return out


def evaluate_run(preset: Preset, run: Run, cfg: Config, source) -> dict[str, dict]:
    """{str(length): metrics (and the compiled eval's bytes), or {"skipped": why}} of the finished run in the
    folder `source` (its last step: the convergence rule's stop, or the cap), at each of the run's test lengths."""
    lm = make_lm_config(cfg.model, make_dataset(cfg.data, cfg.seed).vocab_size)
    params = load_params(source, read_json(source / SUMMARY)["steps"])
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(0))))
    lengths = test_lengths(preset, run, cfg.data.seq_len)
    return {str(L): _length_metrics(preset, run, cfg, graphdef, params, L) for L in lengths}
