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


def _check_steps(shape, overrides: list[str], seed: int | None = None) -> dict[str, list[float]]:
    """STEPS train steps of the TINY model with `overrides` (data.seq_len 32) under a (data, fsdp, sequence) mesh
    of `shape` against the single-device step, each from the same state: before every step the single-device
    state is placed on the mesh, so a step's difference is that step's alone and rounding does not compound across
    steps (Adam's first updates are sign-like, so two float32 orders of one sum can send a near-zero gradient's
    parameter either way and every later step reads the difference: compounded over 3 steps, a G model's gradient
    norm moved by 1.07e-5 of itself in CI). Each step's loss, accuracy and gradient norm may differ from the
    single-device step's by 1e-5 of their size, its new parameters likewise. Measured from the same state (13 seeds
    each of DD, GG and MM at this suite's -O0, 3 steps): gradient norms within 4.2e-6 of themselves (a norm of 15-75,
    a sum over every parameter's gradient in another order), losses within 2.2e-7, parameters within 1.3e-7.

    Returns:
        Each metric's relative difference per step (a seed is drawn when `seed` is None, and named on failure)."""
    seed = int(np.random.SeedSequence().generate_state(1)[0] % 2**31) if seed is None else seed
    cfg = compose_config([*TINY, "data.seq_len=32", "data.vocab_size=40", *overrides, f"seed={seed}"])
    lm, dataset = build(cfg)
    tx, _ = make_optimizer(cfg.optim, cfg.trainer.steps)
    init = make_init(lm, tx, cfg.seed)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(cfg.seed))))

    mesh = make_mesh(*shape)
    shardings = state_shardings(jax.eval_shape(init), mesh)
    one_step = make_train_step(graphdef, tx, TraceCount())
    traces = TraceCount()
    sharded_step = make_train_step(
        graphdef, tx, traces, mesh=mesh, state_shardings=shardings, batch_sharding=batch_sharding(mesh)
    )
    one = jax.jit(init)()
    assert rel_err(_flat(jax.jit(init, out_shardings=shardings)()), _flat(one)) == 0  # placement alone
    if mesh.shape["fsdp"] > 1:
        specs = [s.spec for s in jax.tree.leaves(shardings["params"])]
        assert any("fsdp" in spec for spec in specs)

    errors = {key: [] for key in (*METRICS, "params")}
    for i in range(STEPS):
        batch = dataset.batch(i)
        placed_state = jax.device_put(jax.tree.map(np.asarray, one), shardings)  # fresh buffers: the step donates
        placed = device_batch(batch, lambda a: put_batch(a, batch_sharding(mesh)))
        if i == 0:  # the context-parallel ops are in the program when the sequence is split
            text = sharded_step.lower(placed_state, placed).as_text()
            assert ("collective_permute" in text) == (mesh.shape["sequence"] > 1)
        sharded, m_sharded = sharded_step(placed_state, placed)
        one, m_one = one_step(one, device_batch(batch))
        for key in METRICS:
            want = float(m_one[key])
            errors[key].append(abs(float(m_sharded[key]) - want) / max(1.0, abs(want)))
        errors["params"].append(rel_err(_flat(sharded["params"]), _flat(one["params"])))
        for got, want in zip(jax.tree.leaves(sharded), jax.tree.leaves(shardings)):
            assert got.sharding == want  # the state stays where the FSDP rule puts it
        assert int(sharded["step"]) == i + 1
    assert traces.count == 1
    for key, values in errors.items():
        assert max(values) <= 1e-5, (key, values, f"seed={seed}")
    return errors
