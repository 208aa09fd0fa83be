"""The power-retention Pallas kernels: interpret mode on CPU against the float64 reference (forward, gradients,
decode, both kernel variants), and lowering for TPU (Mosaic) and an abstract H200 (Triton).

Interpret mode fills every kernel output with NaN before the kernel runs (checked below), so an element a kernel
fails to write comes back NaN and fails every error bound.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.mesh import AbstractDevice, AbstractMesh
from jax.experimental import pallas as pl

from retention import init_state, power_retention, power_retention_reference
from retention.ops.power_retention.pallas import chunked_pallas, step_pallas
from retention.ops.power_retention.recurrent import chunk_step
from retention.ops.power_retention.state import RetentionState
from tests.helpers import f64, random_qkv, rel_err

F32_TOL = 2e-5
BF16_TOL = 2e-2


def _pallas(q, k, v, log_g, state=None, *, chunk, backend):
    B, _, _, d = q.shape
    state = init_state(B, k.shape[2], d) if state is None else state
    return chunked_pallas(q, k, v, log_g, state, deg=2, scale=d**-0.5, chunk_size=chunk, backend=backend)


def _reference(q, k, v, log_g):
    return power_retention_reference(*f64(q, k, v, log_g), deg=2)


def test_interpret_mode_poisons_outputs_with_nan():
    def write_first_half(x_ref, o_ref):
        o_ref[:4] = x_ref[:4]

    out = pl.pallas_call(write_first_half, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), interpret=True)(
        jnp.ones((8, 128), jnp.float32))
    assert np.all(np.asarray(out[:4]) == 1) and np.all(np.isnan(np.asarray(out[4:])))


FORWARD_CASES = [
    # T, Hq, H, d, gate, chunk, dtype, backend
    (1, 2, 2, 16, None, 16, jnp.float32, "gpu"),
    (37, 4, 2, 16, "mild", 16, jnp.float32, "tpu"),
    (100, 2, 1, 16, "strong", 32, jnp.float32, "gpu"),
    (100, 4, 2, 16, None, 32, jnp.bfloat16, "tpu"),
]


@pytest.mark.parametrize("T,Hq,H,d,gate,chunk,dtype,backend", FORWARD_CASES)
def test_forward_matches_reference(T, Hq, H, d, gate, chunk, dtype, backend):
    q, k, v, log_g = random_qkv(T, 2, T, Hq, H, d, dtype=dtype, gate=gate)
    y, state = _pallas(q, k, v, log_g, chunk=chunk, backend=backend)
    assert y.dtype == dtype and y.shape == q.shape
    tol = F32_TOL if dtype == jnp.float32 else BF16_TOL
    assert rel_err(y, _reference(q, k, v, log_g)) < tol
    _, state_xla = power_retention(*f64(q, k, v, log_g), chunk_size=chunk, return_state=True, impl="xla")
    assert rel_err(state.S, state_xla.S) < tol and rel_err(state.z, state_xla.z) < tol


GRAD_CASES = [
    # T, Hq, H, d, gate, chunk, dtype, backend
    (37, 4, 2, 16, "mild", 16, jnp.float32, "gpu"),
    (37, 2, 2, 16, None, 16, jnp.float32, "tpu"),
    (50, 4, 2, 16, "mild", 32, jnp.bfloat16, "gpu"),
]


@pytest.mark.parametrize("T,Hq,H,d,gate,chunk,dtype,backend", GRAD_CASES)
def test_gradients_match_reference(T, Hq, H, d, gate, chunk, dtype, backend):
    q, k, v, log_g = random_qkv(T + 1, 2, T, Hq, H, d, dtype=dtype, gate=gate)
    log_g = jnp.zeros(k.shape[:3], jnp.float32) if log_g is None else log_g  # gradient of the gate, gated or not
    ct = jax.random.normal(jax.random.key(T), q.shape, jnp.float32)
    args = (0, 1, 2, 3)
    loss = lambda *a: jnp.vdot(_pallas(*a, chunk=chunk, backend=backend)[0].astype(jnp.float32), ct)
    grads = jax.grad(loss, args)(q, k, v, log_g)
    expected = jax.grad(lambda *a: jnp.vdot(power_retention_reference(*a, deg=2), f64(ct)[0]), args)(
        *f64(q, k, v, log_g))
    tol = F32_TOL if dtype == jnp.float32 else BF16_TOL
    for name, g, e in zip("q k v log_g".split(), grads, expected):
        assert g.dtype == (jnp.float32 if name == "log_g" else dtype) and rel_err(g, e) < tol, name


def test_gradients_through_the_state_match_the_xla_path():
    """Initial state in, final state out: gradients w.r.t. q, k, v, log_g, S0 and z0 against the XLA chunked path."""
    B, T, Hq, H, d, chunk = 1, 40, 2, 1, 16, 16
    q, k, v, log_g = random_qkv(11, B, T, Hq, H, d, gate="strong")
    _, state0 = power_retention(*random_qkv(12, B, 20, Hq, H, d, gate="mild"), chunk_size=16, return_state=True)
    kS, kz, ky = jax.random.split(jax.random.key(13), 3)
    ct_S, ct_z = jax.random.normal(kS, state0.S.shape), jax.random.normal(kz, state0.z.shape)
    ct_y = jax.random.normal(ky, q.shape)

    def loss(op):
        def f(q, k, v, log_g, S, z):
            y, state = op(q, k, v, log_g, RetentionState(S, z))
            return jnp.vdot(y, ct_y) + jnp.vdot(state.S, ct_S) + jnp.vdot(state.z, ct_z)
        return jax.grad(f, argnums=tuple(range(6)))

    xla = lambda q, k, v, g, s: power_retention(q, k, v, g, initial_state=s, chunk_size=chunk, return_state=True,
                                                impl="xla")
    grads = loss(lambda *a: _pallas(*a, chunk=chunk, backend="gpu"))(q, k, v, log_g, *state0)
    expected = loss(xla)(*f64(q, k, v, log_g, *state0))
    for name, g, e in zip("q k v log_g S0 z0".split(), grads, expected):
        assert rel_err(g, e) < F32_TOL, name


@pytest.mark.parametrize("n,d,backend", [(1, 32, "gpu"), (3, 16, "tpu")])  # GPU: d = 32 is 2 column blocks
def test_decode_matches_reference(n, d, backend):
    B, T, Hq, H = 2, 21, 4, 2
    q, k, v, log_g = random_qkv(n, B, T, Hq, H, d, gate="mild")
    t0 = T - n
    _, state = power_retention(q[:, :t0], k[:, :t0], v[:, :t0], log_g[:, :t0], chunk_size=16, return_state=True)
    new = (q[:, t0:], k[:, t0:], v[:, t0:], log_g[:, t0:])
    step = lambda *a: step_pallas(state, *a, deg=2, scale=d**-0.5, backend=backend)
    (y, state_new), vjp = jax.vjp(step, *new)  # one kernel run gives the outputs and the gradients
    assert rel_err(y, _reference(q, k, v, log_g)[:, t0:]) < F32_TOL
    (_, state_xla), vjp_xla = jax.vjp(lambda *a: chunk_step(state, *a, deg=2, scale=d**-0.5), *new)
    assert rel_err(state_new.S, state_xla.S) < F32_TOL and rel_err(state_new.z, state_xla.z) < F32_TOL
    ct = (jax.random.normal(jax.random.key(n), y.shape, jnp.float32), jax.tree.map(jnp.ones_like, state_new))
    for g, e in zip(vjp(ct), vjp_xla(ct)):
        assert rel_err(g, e) < F32_TOL


def test_unsupported_settings_raise():
    q, k, v, _ = random_qkv(0, 1, 8, 2, 2, 16)
    with pytest.raises(NotImplementedError, match="deg=4"):
        chunked_pallas(q, k, v, None, init_state(1, 2, 16, 4), deg=4, scale=0.25, chunk_size=16)
    q, k, v, _ = random_qkv(0, 1, 8, 2, 2, 24)
    with pytest.raises(ValueError, match="d=24"):
        chunked_pallas(q, k, v, None, init_state(1, 2, 24), deg=2, scale=0.2, chunk_size=16, backend="gpu")


# Lowering: nothing is allocated, so realistic head dims cost only tracing time.

H200 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(device_kind="NVIDIA H200", num_cores=None,
                                                                  platform="cuda"))


def _kernels(d, backend):
    """(name, function, abstract args) for forward, backward and decode at head dim d."""
    B, T, Hq, H, chunk = 1, 256, 2, 1, 128
    x = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt)
    q, kv, log_g = x(B, T, Hq, d), x(B, T, H, d), x(B, T, H, dt=jnp.float32)
    state = jax.eval_shape(lambda: init_state(B, H, d))
    fwd = lambda q, k, v, g, s: chunked_pallas(q, k, v, g, s, deg=2, scale=d**-0.5, chunk_size=chunk,
                                               interpret=False, backend=backend)
    bwd = jax.grad(lambda *a: fwd(*a)[0].astype(jnp.float32).sum(), argnums=(0, 1, 2, 3, 4))
    dec = lambda s, q, k, v, g: step_pallas(s, q, k, v, g, deg=2, scale=d**-0.5, interpret=False, backend=backend)
    step = (state, x(B, 1, Hq, d), x(B, 1, H, d), x(B, 1, H, d), x(B, 1, H, dt=jnp.float32))
    return [("forward", fwd, (q, kv, kv, log_g, state)), ("backward", bwd, (q, kv, kv, log_g, state)),
            ("decode", dec, step)]


@pytest.mark.parametrize("d", [64, 128])
def test_kernels_lower_for_tpu(d):
    for name, f, args in _kernels(d, "tpu"):
        module = jax.export.export(jax.jit(f), platforms=["tpu"])(*args).mlir_module()
        assert "tpu_custom_call" in module, name


@pytest.mark.parametrize("d", [64, 128])
def test_kernels_lower_for_h200_through_triton(d):
    with jax.sharding.use_abstract_mesh(H200):
        for name, f, args in _kernels(d, "gpu"):
            exported = jax.export.export(
                jax.jit(f), platforms=["cuda"],
                disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(*args)
            assert "__gpu$xla.gpu.triton" in exported.mlir_module(), name
