"""The sharded train step on 8 host devices (run by test_eight_devices.py): under a (data, fsdp, sequence) mesh,
with the state FSDP-sharded, the batch split and the sequence split (context-parallel retention, gathered K/V for
attention; D, G and M layers on their context-parallel ops), a few steps give the losses and parameters of the
single-device step to float32 rounding."""

import jax
import numpy as np
import pytest
from flax import nnx

from retention.nn import LM
from retention.parallel import batch_sharding, make_mesh, put_batch, state_shardings
from retention.train import build
from retention.train.optimizer import make_optimizer
from retention.train.step import TraceCount, device_batch, make_init, make_train_step
from tests.helpers import rel_err
from tests.parallel.common import require_devices
from tests.train.common import TINY, compose_config

require_devices()
pytestmark = pytest.mark.integration  # run by test_eight_devices.py's integration test, in its tier

STEPS = 3
METRICS = ("loss", "accuracy", "grad_norm")
SPREAD = 4  # the mesh's steps may move a metric by this many times what a change of chunk size moves it on one device


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


@pytest.mark.parametrize("shape", [(2, 2, 2), pytest.param((1, 1, 8), marks=pytest.mark.slow)])
def test_sharded_step_equals_single_device_step(shape):
    _check_steps(shape, ["model.pattern=PAW", "model.n_layers=3", "model.window=5", "data.batch_size=8"])


@pytest.mark.parametrize("pattern", ["DD", "GG", "MM"])
def test_matrix_state_mixers_train_on_a_data_and_sequence_mesh(pattern):
    """D, G and M (with the short convolution, which crosses the devices' boundaries too) on (data 2, sequence 4),
    8 tokens per device: the context-parallel ops in the step, the losses and parameters of one device's steps."""
    options = ["model.conv_size=4", "model.ssm_state_size=8", "model.ssm_groups=2", "data.batch_size=4"]
    _check_steps((2, 1, 4), [f"model.pattern={pattern}", *options])


def _check_steps(shape, overrides: list[str]) -> None:
    """STEPS train steps of the TINY model with `overrides` (data.seq_len 32) under a (data, fsdp, sequence) mesh
    of `shape` against the single-device step: the losses, accuracies and gradient norms each step, the parameters
    at the end.

    Each metric may differ from the single-device step's by 1e-5 of its size, or by SPREAD times what the
    single-device steps themselves move when only their summation order changes (the same steps with one chunk of
    32 where the model has two of 16), whichever is larger. A D model's gradient norm is that sensitive to rounding:
    over 16 seeds (at this suite's -O0) the mesh moved it by up to 2.4e-5 of itself and the chunk size alone by up
    to 1.1e-5 (seed 72124473: 2.4e-5 and 1.1e-5), the largest ratio of the two 2.3, where loss and accuracy move by
    5e-7 or less; a fixed 1e-5 failed on rounding alone."""
    seed = int(np.random.SeedSequence().generate_state(1)[0] % 2**31)
    base = [*TINY, "data.seq_len=32", "data.vocab_size=40", *overrides, f"seed={seed}"]
    cfg = compose_config(base)
    lm, dataset = build(cfg)
    tx, _ = make_optimizer(cfg.optim, cfg.trainer.steps)
    init = make_init(lm, tx, cfg.seed)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(cfg.seed))))
    assert lm.chunk_size == 16
    reordered_lm, _ = build(compose_config([*base, "model.chunk_size=32"]))
    reordered_graphdef = nnx.graphdef(nnx.eval_shape(lambda: LM(reordered_lm, rngs=nnx.Rngs(cfg.seed))))
    reordered_step = make_train_step(reordered_graphdef, tx, TraceCount())

    mesh = make_mesh(*shape)
    shardings = state_shardings(jax.eval_shape(init), mesh)
    one_step = make_train_step(graphdef, tx, TraceCount())
    traces = TraceCount()
    sharded_step = make_train_step(
        graphdef, tx, traces, mesh=mesh, state_shardings=shardings, batch_sharding=batch_sharding(mesh)
    )
    one, sharded = jax.jit(init)(), jax.jit(init, out_shardings=shardings)()
    reordered = jax.jit(init)()
    errors, spreads = {key: [] for key in METRICS}, {key: [] for key in METRICS}
    assert rel_err(_flat(sharded), _flat(one)) == 0  # the same initial state, only placed differently
    if mesh.shape["fsdp"] > 1:
        specs = [s.spec for s in jax.tree.leaves(shardings["params"])]
        assert any("fsdp" in spec for spec in specs)

    for i in range(STEPS):
        batch = dataset.batch(i)
        one, m_one = one_step(one, device_batch(batch))
        reordered, m_reordered = reordered_step(reordered, device_batch(batch))
        placed = device_batch(batch, lambda a: put_batch(a, batch_sharding(mesh)))
        if i == 0:  # the context-parallel ops are in the program when the sequence is split
            text = sharded_step.lower(sharded, placed).as_text()
            assert ("collective_permute" in text) == (mesh.shape["sequence"] > 1)
        sharded, m_sharded = sharded_step(sharded, placed)
        for key in METRICS:
            want = float(m_one[key])
            errors[key].append(abs(float(m_sharded[key]) - want) / max(1.0, abs(want)))
            spreads[key].append(abs(float(m_reordered[key]) - want) / max(1.0, abs(want)))
    for key in METRICS:
        assert max(errors[key]) <= max(1e-5, SPREAD * max(spreads[key])), (key, errors[key], spreads[key])
    assert traces.count == 1
    for got, want in zip(jax.tree.leaves(sharded), jax.tree.leaves(shardings)):
        assert got.sharding == want  # the state stays where the FSDP rule puts it
    assert rel_err(_flat(sharded["params"]), _flat(one["params"])) < 1e-5
    assert int(sharded["step"]) == STEPS
