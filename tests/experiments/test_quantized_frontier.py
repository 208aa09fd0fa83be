"""Quantized states on the recall-memory frontier, and the long lengths' query count (experiments/compare): a
quantized-state entry reads its base's model token by token with the states re-quantized after every token, as
`generate(..., state_format=...)` does (its eval of generate's own greedy continuation is right at every token,
the float state's is not; a hand-written loop of decode steps and round trips gives its sums), its bytes are
those of the quantized arrays, and a long length reads at least the task's `long_min_queries` labelled targets
through decode steps that carry the state (the full forward's sums, in less memory)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.cache_memory import sequence_cache_bytes
from experiments.compare.evaluate import (
    _forward_sums,
    _length_metrics,
    check_quantized_states,
    decode_sums,
)
from experiments.compare.models import compose_config, lm_cache_bytes
from experiments.compare.presets import (
    CPU,
    GPU,
    SMOKE,
    STATE_FORMAT_CODES,
    TEST_OFFSET,
    Entry,
    Task,
    quantized_state_entries,
)
from experiments.compare.protocol import Run
from experiments.compare.quality import run_overrides
from retention import generate, prefill
from retention.data.base import IGNORE
from retention.nn import LM, LMConfig
from retention.serve.quantized_state import STATE_FORMATS, quantize_caches, quantize_states, round_trip_states
from retention.train.config import make_dataset, make_lm_config
from retention.train.step import SCALAR_SUMS

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration

CONFIG = LMConfig(vocab_size=61, d_model=32, n_layers=2, pattern="PM", n_heads=4, n_kv_heads=4, head_dim=8)


def _random_model(preset, task: str, entry: str):
    """(the run, its config, graphdef, random params) of `entry`'s model on `task`: the model its eval merges."""
    spec = preset.tasks[task]
    run = Run(task, entry, spec.lrs[0], spec.seeds[0])
    cfg = compose_config(run_overrides(preset, run))
    lm = make_lm_config(cfg.model, make_dataset(cfg.data, cfg.seed).vocab_size)
    graphdef, params = nnx.split(LM(lm, rngs=nnx.Rngs(1)))
    return run, cfg, graphdef, params


@pytest.mark.parametrize("state_format", ["fp8", pytest.param(8, marks=pytest.mark.slow)])
def test_the_quantized_state_eval_reads_what_generate_reads(state_format):
    """generate's greedy continuation with re-quantized states, read back by the eval (inputs its tokens, targets
    the next ones): every argmax is generate's token; with float32 states the eval misses some of them (the
    quantized states change the greedy path here) and its loss differs by a little."""
    model = LM(CONFIG, rngs=nnx.Rngs(3))
    prompt = jax.random.randint(jax.random.key(4), (4, 1), 0, CONFIG.vocab_size, dtype=jnp.int32)
    tokens = generate(model, prompt, 48, temperature=0.0, state_format=state_format).tokens
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    quantized = decode_sums(model, inputs, targets, chunk=1, state_format=state_format)
    assert float(quantized["correct"]) == float(quantized["labels"]) == 4 * 48
    plain = decode_sums(model, inputs, targets, chunk=1)
    assert float(plain["correct"]) < 4 * 48
    loss_q, loss_f = float(quantized["nll"]) / 192, float(plain["nll"]) / 192
    assert 0 < abs(loss_q - loss_f) < 0.1 * loss_f


def test_a_quantized_state_entry_equals_a_hand_loop_of_round_trips():
    """The smoke preset's power_state_fp8 on its base's (random) model at T=64, through the preset's eval: the
    sums of a hand-written loop (prefill one token, then a decode step per token, the states round-tripped in fp8
    before each), the test batches' queries, and a loss other than the float state's by a little."""
    run, cfg, graphdef, params = _random_model(SMOKE, "mqar", "power_state_fp8")
    out = _length_metrics(SMOKE, run, cfg, graphdef, params, 64)
    spec = SMOKE.tasks["mqar"]
    batch = spec.test_tokens // 64
    data = make_dataset(dataclasses.replace(cfg.data, batch_size=batch), cfg.seed)
    model = nnx.merge(graphdef, params)
    requantize = jax.jit(round_trip_states, static_argnums=1)  # eagerly every primitive compiles on its own
    correct = labels = nll = 0.0
    for i in range(spec.test_batches):
        b = data.batch(TEST_OFFSET + i, seq_len=64, split="eval")
        logits, caches = model.prefill(jnp.asarray(b.inputs[:, :1]), 64)
        steps = [logits]
        for t in range(1, 64):
            logits, caches = model.decode_step(jnp.asarray(b.inputs[:, t : t + 1]), requantize(caches, "fp8"))
            steps.append(logits)
        logp = np.asarray(jax.nn.log_softmax(jnp.concatenate(steps, axis=1), axis=-1))
        mask = b.targets != IGNORE
        correct += float(np.sum((logp.argmax(-1) == b.targets) & mask))
        labels += float(mask.sum())
        nll -= float(np.take_along_axis(logp, np.where(mask, b.targets, 0)[..., None], -1)[..., 0][mask].sum())
    assert out["queries"] == labels == 4 * batch * spec.test_batches
    assert out["accuracy"] == correct / labels
    assert out["loss"] == pytest.approx(nll / labels, rel=1e-5)
    plain = _length_metrics(SMOKE, Run("mqar", "power", run.lr, run.seed), cfg, graphdef, params, 64)
    assert 0 < abs(out["loss"] - plain["loss"]) < 0.1 * plain["loss"]


@pytest.mark.parametrize("state_format", STATE_FORMATS)
def test_quantized_state_bytes_are_the_arrays_bytes(state_format):
    """sequence_cache_bytes with a state format (the frontier's x) is the nbytes of a quantized snapshot's arrays,
    for P, D, G and M layers beside an A layer; each state row of r float32 values became r values of 1 byte (4
    bits: r / 2) and a scale (bfloat16 for the integer formats, float32 for fp8)."""
    config = dataclasses.replace(CONFIG, n_layers=5, pattern="PDGMA")
    model = LM(config, rngs=nnx.Rngs(0))
    snapshot = prefill(model, jnp.ones((1, 5), jnp.int32), max_len=40)
    quantized = quantize_states(snapshot, state_format)
    nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
    assert nbytes(quantized.caches) == sequence_cache_bytes(model, 40, state_format)
    assert nbytes(snapshot.caches) == sequence_cache_bytes(model, 40)
    value_bytes, scale_bytes = {8: (1, 2), 4: (0.5, 2), "fp8": (1, 4)}[state_format]
    states = [layer.state for layer in snapshot.caches.layers[:4]]
    arrays = [states[0].S, states[0].z, *states[1:]]  # P's S and z, D's, G's and M's S
    saved = sum(x.size * (4 - value_bytes) - (x.size // x.shape[-1]) * scale_bytes for x in arrays)
    assert nbytes(snapshot.caches) - nbytes(quantized.caches) == saved


def test_the_presets_state_bytes_are_its_models_arrays_bytes():
    """The bytes the comparison draws for the cpu preset's power_state_int8 (lm_cache_bytes of its base's config
    in int8) are those of its model's prefilled caches quantized by quantize_caches, and under the float state's."""
    cfg = compose_config(run_overrides(CPU, Run("mqar", "power_state_int8", 1e-2, 0)))
    model = LM(make_lm_config(cfg.model, 128), rngs=nnx.Rngs(0))
    _, caches = model.prefill(jnp.ones((1, 64), jnp.int32), 64)
    quantized = quantize_caches(caches, CPU.entries["power_state_int8"].state_code)
    assert lm_cache_bytes(cfg, 64, 8) == sum(x.nbytes for x in jax.tree.leaves(quantized))
    assert lm_cache_bytes(cfg, 64, 8) < lm_cache_bytes(cfg, 64) / 3


LONG = dataclasses.replace(
    SMOKE,
    tasks={
        "mqar": Task(
            "mqar",
            SMOKE.tasks["mqar"].experiment,
            lrs=(1e-2,),
            seeds=(0,),
            test_scales=(1,),
            long_lengths=(512,),
            test_batches=1,
            test_tokens=512,  # one sequence a batch at 512
            long_chunk=64,
            long_min_queries=30,  # MQAR has 4 a sequence: 8 batches
        )
    },
)


def test_a_long_length_reads_the_queries_asked_for_carrying_the_state():
    """At the long length (512) the eval draws batches until its labelled targets (counted here from the batches)
    reach long_min_queries; its sums are the full forward's over the same batches (the decode steps of 64 tokens
    carry the state), in less memory than the forward's; the training length reads test_batches only."""
    run, cfg, graphdef, params = _random_model(LONG, "mqar", "power")
    long = _length_metrics(LONG, run, cfg, graphdef, params, 512)
    data = make_dataset(dataclasses.replace(cfg.data, batch_size=1), cfg.seed)
    batches = [data.batch(TEST_OFFSET + i, seq_len=512, split="eval") for i in range(long["sequences"])]
    counts = [int(np.sum(b.targets != IGNORE)) for b in batches]
    assert long["queries"] == sum(counts) >= 30 > sum(counts[:-1])  # no batch more than it needed
    forward = [_forward_sums(graphdef, params, jnp.asarray(b.inputs), jnp.asarray(b.targets)) for b in batches]
    assert long["accuracy"] == sum(float(f["correct"]) for f in forward) / sum(counts)
    assert long["loss"] == pytest.approx(sum(float(f["nll"]) for f in forward) / sum(counts), rel=1e-5)
    tokens = jax.ShapeDtypeStruct((1, 512), jnp.int32)
    memory = _forward_sums.lower(graphdef, params, tokens, tokens).compile().memory_analysis()
    assert long["eval_bytes"] < memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes
    short = _length_metrics(LONG, run, cfg, graphdef, params, 64)
    assert short["sequences"] == 512 // 64 and short["queries"] == 4 * 512 // 64


def test_a_scan_of_decode_steps_with_a_short_last_step_equals_the_forward():
    """decode_sums at a chunk that does not divide the length (a prefill of 24, steps of 24, a last step of 16)
    gives the full forward's sums, a row's exact match over all its steps (labels in four steps, row 0 right at
    every one: exact; row 1 wrong at its last: not exact) and each position's sums where the forward has them."""
    model = LM(CONFIG, rngs=nnx.Rngs(0))
    inputs = jax.random.randint(jax.random.key(0), (2, 88), 0, CONFIG.vocab_size, dtype=jnp.int32)
    predicted = np.asarray(jnp.argmax(model(inputs), axis=-1))
    targets = np.full((2, 88), IGNORE, np.int32)
    at = [10, 30, 60, 80]
    targets[:, at] = predicted[:, at]
    targets[1, 80] = (predicted[1, 80] + 1) % CONFIG.vocab_size
    stepped = decode_sums(model, inputs, jnp.asarray(targets), chunk=24)
    full = _forward_sums(*nnx.split(model), inputs, jnp.asarray(targets))
    assert {k: float(stepped[k]) for k in SCALAR_SUMS} == {
        "correct": 7,
        "labels": 8,
        "exact": 1,
        "rows": 2,
        **{"nll": pytest.approx(float(full["nll"]), rel=1e-5)},
    }
    assert all(float(stepped[k]) == float(full[k]) for k in ("correct", "labels", "exact", "rows"))
    np.testing.assert_array_equal(stepped["labels_T"], full["labels_T"])  # per position, every step in its place
    np.testing.assert_allclose(stepped["nll_T"], full["nll_T"], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="chunk must be an int >= 1"):
        decode_sums(model, inputs, jnp.asarray(targets), chunk=0)


def test_entries_name_what_they_quantize():
    """Each fixed-state model of the cpu and gpu frontiers (power, D, G, M) has its int8 and fp8 state entries on
    the frontier, each evaluating its base's runs; a bad state format, both quantizations or no base are refused
    naming the argument; a model without a recurrent state is refused a quantized-state eval."""
    assert set(STATE_FORMAT_CODES.values()) == set(STATE_FORMATS)
    for preset in (CPU, GPU):
        for base in ("power", "gated_deltanet", "gla", "mamba2"):
            for fmt in ("int8", "fp8"):
                entry = preset.entries[f"{base}_state_{fmt}"]
                assert f"{base}_state_{fmt}" in preset.frontier and (entry.base, entry.state_format) == (base, fmt)
                assert not entry.trained and entry.kv_cache_bits is None
    assert quantized_state_entries()["mamba2_state_fp8"].state_code == "fp8"
    with pytest.raises(ValueError, match="state_format must be None or one of .*got 'int16'"):
        Entry("power", state_format="int16", base="power")
    with pytest.raises(ValueError, match="not both: got kv_cache_bits=8, state_format='int8'"):
        Entry("power", kv_cache_bits=8, state_format="int8", base="power")
    with pytest.raises(ValueError, match="base must be set"):
        Entry("power", state_format="fp8")
    softmax = LM(dataclasses.replace(CONFIG, pattern="A"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="entry 'softmax_state_int8' .* layers \\(AA\\) hold no recurrent state"):
        check_quantized_states("softmax_state_int8", softmax, 8)


def test_the_cpu_preset_reads_512_queries_at_64k_and_skips_growing_caches():
    """cpu's MQAR reads 512 queries at 64k, its fixed states through decode steps; softmax and the hybrid (an A
    layer: cost in L^2) are left out there with their cost stated."""
    spec = CPU.tasks["mqar"]
    assert spec.long_lengths == (65536,) and spec.long_min_queries >= 512 and spec.long_chunk < 65536
    for entry in ("softmax", "hybrid"):
        assert "time" in CPU.long_eval_skip[entry]
    assert not {"power", "swa", "swa_matched"} & set(CPU.long_eval_skip)
