"""The Pallas kernels under a mesh on 8 host devices, in interpret mode (run by test_eight_devices.py).

The op with impl="pallas" under (data, fsdp, sequence) = (8,1,1), (1,8,1), (2,2,2) and (1,1,8) equals the
single-device op: outputs, final state and every gradient (q, k, v, log_g, the initial state). (8,1,1) splits the
batch over `data`; (1,8,1) cannot split B=2 over 8 devices, so it splits the heads over `fsdp`; (2,2,2) and (1,1,8)
split the sequence (the context-parallel op, whose shard_map holds the kernels); (data, fsdp, sequence, tensor) =
(2,1,2,2) also splits its heads over tensor. Placed on the mesh, the kernels' program gathers nothing. The decode
step and a 2-layer LM train step (model.retention_impl=pallas, (2,2,2)) equal their single-device and XLA
counterparts.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from retention import RetentionState, power_retention, power_retention_step
from retention.nn import LM
from retention.ops import power_retention_context_parallel
from retention.parallel import batch_sharding, make_mesh, put_batch, state_shardings
from retention.train import build
from retention.train.optimizer import make_optimizer
from retention.train.step import TraceCount, device_batch, make_init, make_train_step
from tests.helpers import random_qkv, rel_err
from tests.parallel.common import require_devices
from tests.train.common import TINY, compose_config

require_devices()
pytestmark = pytest.mark.integration  # run by test_eight_devices.py's integration test, in its tier

TOL = 2e-5  # float32: the kernels against the XLA path (DESIGN: well under 1e-4)
CHUNK = 16


def _inputs(seed, B, T, Hq, H, d=16):
    q, k, v, log_g = random_qkv(seed, B, T, Hq, H, d, gate="mild")
    # an initial state made by the op itself from 24 earlier tokens
    pq, pk, pv, pg = random_qkv(seed + 1, B, 24, Hq, H, d, gate="mild")
    _, state0 = jax.jit(lambda *a: power_retention(*a, return_state=True, impl="xla"))(pq, pk, pv, pg)
    return q, k, v, log_g, state0


def _cotangents(seed, args):
    q, _, _, _, state0 = args
    keys = jax.random.split(jax.random.key(seed), 3)
    return [jax.random.normal(kk, x.shape, jnp.float32) for kk, x in zip(keys, (q, state0.S, state0.z))]


def _loss_and_grads(op, out_shardings=None):
    """Compiled: (args, cotangents) -> ((<y, ct_y> + <S, ct_S> + <z, ct_z>, (y, state)), the gradients in
    (q, k, v, log_g, S0, z0)), args = (q, k, v, log_g, S0, z0), cotangents (ct_y, ct_S, ct_z); with `out_shardings`
    for its outputs when given."""

    def loss(q, k, v, log_g, S0, z0, cts):
        y, state = op(q, k, v, log_g, RetentionState(S0, z0))
        total = jnp.sum(y * cts[0]) + jnp.sum(state.S * cts[1]) + jnp.sum(state.z * cts[2])  # (vdot flattens: a gather)
        return total, (y, state)

    grad = jax.value_and_grad(loss, argnums=tuple(range(6)), has_aux=True)
    return jax.jit(lambda args, cts: grad(*args, cts), out_shardings=out_shardings)


def _op(impl):
    return lambda q, k, v, log_g, state0: power_retention(
        q, k, v, log_g, chunk_size=CHUNK, initial_state=state0, return_state=True, impl=impl
    )


def _cp(q, k, v, log_g, state0):
    return power_retention_context_parallel(
        q, k, v, log_g, chunk_size=CHUNK, initial_state=state0, return_state=True, impl="pallas"
    )


SLOW = pytest.mark.slow  # (2, 2, 2) splits all three axes; the single-axis splits are further cases
MESHES = [  # (mesh shape, B, T, Hq, H, the axes the plan splits the batch and the heads over)
    pytest.param((8, 1, 1), 8, 40, 4, 2, "data", None, id="(8, 1, 1)", marks=SLOW),
    pytest.param((1, 8, 1), 2, 40, 8, 8, None, "fsdp", id="(1, 8, 1)", marks=SLOW),
    pytest.param((2, 2, 2), 4, 64, 4, 2, None, None, id="(2, 2, 2)"),
    pytest.param((1, 1, 8), 2, 128, 2, 2, None, None, id="(1, 1, 8)", marks=SLOW),
    pytest.param((2, 1, 2, 2), 2, 64, 4, 2, None, None, id="(2, 1, 2, 2)", marks=SLOW),  # heads over tensor
]


@pytest.mark.parametrize("shape,B,T,Hq,H,batch,heads", MESHES)
def test_op_on_mesh_equals_one_device(shape, B, T, Hq, H, batch, heads):
    """Outputs, final state and all gradients against the single-device op (XLA path). Without a sequence split
    the inputs are placed as the plan splits them, and the compiled program (forward and backward) gathers
    nothing."""
    mesh = make_mesh(*shape)
    args = _inputs(sum(shape) + T, B, T, Hq, H)
    cts = _cotangents(0, args)
    flat = (*args[:4], *args[4])
    (_, (y_want, s_want)), g_want = _loss_and_grads(_op("xla"))(flat, cts)
    out_shardings = None
    if shape[2] == 1:  # inputs, cotangents and outputs where the plan splits them: nothing needs gathering
        named = lambda *spec: NamedSharding(mesh, P(*spec))
        tokens, gates, state = named(batch, None, heads, None), named(batch, None, heads), named(batch, heads)
        flat = [jax.device_put(x, s) for x, s in zip(flat, (tokens, tokens, tokens, gates, state, state))]
        cts = [jax.device_put(x, s) for x, s in zip(cts, (tokens, state, state))]
        out_shardings = (
            (named(), (tokens, RetentionState(state, state))),
            (tokens, tokens, tokens, gates, state, state),
        )
    run = _loss_and_grads(_cp if shape[2] > 1 else _op("pallas"), out_shardings)
    with jax.set_mesh(mesh):
        compiled = run.lower(flat, cts).compile()
        (_, (y, state)), grads = compiled(flat, cts)
    assert shape[2] > 1 or "all-gather" not in compiled.as_text()
    for name, a, b in (("y", y, y_want), ("S", state.S, s_want.S), ("z", state.z, s_want.z)):
        assert rel_err(a, b) < TOL, name
    for name, a, b in zip(("q", "k", "v", "log_g", "S0", "z0"), grads, g_want):
        assert rel_err(a, b) < TOL, "d" + name


def test_decode_step_on_mesh():
    """Two tokens through the decode kernel with the batch split over `data` equal the one-device XLA step."""
    mesh = make_mesh(8, 1, 1)
    q, k, v, log_g, state0 = _inputs(5, 8, 2, 4, 2)
    step = lambda impl: jax.jit(lambda s, *x: power_retention_step(s, *x, impl=impl))
    y_one, s_one = step("xla")(state0, q, k, v, log_g)
    with jax.set_mesh(mesh):
        y_mesh, s_mesh = step("pallas")(state0, q, k, v, log_g)
    assert rel_err(y_mesh, y_one) < TOL and rel_err(s_mesh.S, s_one.S) < TOL and rel_err(s_mesh.z, s_one.z) < TOL


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def _lm_parts(impl: str, overrides: list[str]):
    """(init, graphdef, optimizer, dataset) of the tiny trainer config with model.retention_impl=impl."""
    cfg = compose_config([*overrides, f"model.retention_impl={impl}"])
    lm, dataset = build(cfg)
    tx, _ = make_optimizer(cfg.optim, cfg.trainer.steps)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(cfg.seed))))
    return make_init(lm, tx, cfg.seed), graphdef, tx, dataset


@SLOW  # a further case: the op on the (2, 2, 2) mesh above, and the sharded XLA step (multidevice_step.py)
def test_lm_train_step_with_kernels_on_mesh_equals_xla():
    """A train step of a 2-layer PA model, retention on the kernels under (2,2,2) (the sequence split: the
    context-parallel op runs them), against the single-device XLA path: losses and parameters."""
    overrides = [*TINY, "model.head_dim=16", "data.seq_len=32", "data.vocab_size=40", "data.batch_size=4"]
    init, graphdef_xla, tx, dataset = _lm_parts("xla", overrides)
    _, graphdef_pallas, _, _ = _lm_parts("pallas", overrides)
    mesh = make_mesh(2, 2, 2)
    shardings = state_shardings(jax.eval_shape(init), mesh)
    one_step = make_train_step(graphdef_xla, tx, TraceCount())
    sharded_step = make_train_step(
        graphdef_pallas, tx, TraceCount(), mesh=mesh, state_shardings=shardings, batch_sharding=batch_sharding(mesh)
    )
    one, sharded = jax.jit(init)(), jax.jit(init, out_shardings=shardings)()
    batch = dataset.batch(0)
    one, m_one = one_step(one, device_batch(batch))
    sharded, m_sharded = sharded_step(sharded, device_batch(batch, partial(put_batch, sharding=batch_sharding(mesh))))
    for key in ("loss", "grad_norm"):
        assert abs(float(m_sharded[key]) - float(m_one[key])) <= 1e-5 * max(1.0, abs(float(m_one[key]))), key
    assert rel_err(_flat(sharded["params"]), _flat(one["params"])) < 1e-5
