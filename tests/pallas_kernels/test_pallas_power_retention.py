"""The power-retention Pallas kernels, through the op layer (retention/ops/power_retention/pallas.py): interpret
mode on CPU on the case table (tests/ops/cases.py), and lowering for TPU (Mosaic) and an abstract H200 (Triton).

Each variant is a stepping path: all but the last 3 tokens at once (the chunked kernels, from the state, when that
is more than the chunk size; else the decode kernel), then 3 tokens (the decode kernel), with outputs, final states
and gradients checked against the float64 oracles. The kernels support degree 2 only, so:
- gpu: the GPU (Triton) variant through the public ops with impl="pallas" (which picks it on CPU), on the cases
  with a power-of-two head dim >= 16, query heads per kv-head and chunk size;
- tpu: the TPU (Mosaic) variant through the op layer's kernel glue with backend="tpu", on every degree-2 case.
Interpret mode fills every kernel output with NaN before the kernel runs (checked below), so an element a kernel
fails to write comes back NaN and fails every error bound.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.mesh import AbstractDevice, AbstractMesh
from jax.experimental import pallas as pl

from retention import init_state, power_retention_step
from retention.ops.chunking import DEFAULT_CHUNK_SIZE, default_chunk_size
from retention.ops.power_retention.pallas import chunked_pallas, pallas_supports, step_pallas
from tests.helpers import random_qkv
from tests.ops.cases import case_ids, check_path, stepped


def test_interpret_mode_poisons_outputs_with_nan():
    def write_first_half(x_ref, o_ref):
        o_ref[:4] = x_ref[:4]

    out = pl.pallas_call(write_first_half, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), interpret=True)(
        jnp.ones((8, 128), jnp.float32)
    )
    assert np.all(np.asarray(out[:4]) == 1) and np.all(np.isnan(np.asarray(out[4:])))


def _supported(backend):
    def supported(case):
        chunk = case.chunk or default_chunk_size(case.T)
        return pallas_supports(case.deg, case.d, case.Hq // case.H, chunk, backend)

    return supported


@pytest.mark.parametrize("case", case_ids(_supported("gpu"), quick=lambda case: case.init))
def test_gpu_variant(case):
    step = lambda state, *x: power_retention_step(state, *x, deg=case.deg, chunk_size=case.chunk, impl="pallas")
    check_path(case, stepped(step, lambda q, k: init_state(case.B, case.H, case.d, case.deg)))


@pytest.mark.parametrize("case", case_ids(_supported("tpu"))[::2])
def test_tpu_variant(case):
    """The TPU variant's block layout on every other supported case (the GPU variant above runs them all through
    the same per-chunk math; this halves the suite's interpret-mode time)."""

    def step(state, q, k, v, log_g):
        scale = case.d**-0.5
        if q.shape[1] <= (case.chunk or DEFAULT_CHUNK_SIZE):
            return step_pallas(state, q, k, v, log_g, deg=case.deg, scale=scale, backend="tpu")
        chunk = case.chunk or default_chunk_size(q.shape[1])
        return chunked_pallas(q, k, v, log_g, state, deg=case.deg, scale=scale, chunk_size=chunk, backend="tpu")

    check_path(case, stepped(step, lambda q, k: init_state(case.B, case.H, case.d, case.deg)))


def test_unsupported_settings_raise():
    q, k, v, _ = random_qkv(0, 1, 8, 2, 2, 16)
    with pytest.raises(NotImplementedError, match="deg=4"):
        chunked_pallas(q, k, v, None, init_state(1, 2, 16, 4), deg=4, scale=0.25, chunk_size=16)
    with pytest.raises(NotImplementedError, match="deg=4"):
        step_pallas(init_state(1, 2, 16, 4), q, k, v, None, deg=4, scale=0.25)
    q, k, v, _ = random_qkv(0, 1, 8, 2, 2, 24)
    with pytest.raises(ValueError, match="d=24"):
        chunked_pallas(q, k, v, None, init_state(1, 2, 24), deg=2, scale=0.2, chunk_size=16, backend="gpu")
    q, k, v, _ = random_qkv(0, 1, 8, 3, 1, 16)
    with pytest.raises(ValueError, match="query heads per kv-head 3"):
        step_pallas(init_state(1, 1, 16), q, k, v, None, deg=2, scale=0.25, backend="gpu")


# Lowering: nothing is allocated, so realistic head dims cost only tracing time.

H200 = AbstractMesh(
    (1,), ("x",), abstract_device=AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="cuda")
)


def _kernels(d, backend):
    """(name, function, abstract args) for forward, backward and decode at head dim d."""
    B, T, Hq, H, chunk = 1, 256, 2, 1, 128
    x = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt)
    q, kv, log_g = x(B, T, Hq, d), x(B, T, H, d), x(B, T, H, dt=jnp.float32)
    state = jax.eval_shape(lambda: init_state(B, H, d))
    fwd = lambda q, k, v, g, s: chunked_pallas(
        q, k, v, g, s, deg=2, scale=d**-0.5, chunk_size=chunk, interpret=False, backend=backend
    )
    bwd = jax.grad(lambda *a: fwd(*a)[0].astype(jnp.float32).sum(), argnums=(0, 1, 2, 3, 4))
    dec = lambda s, q, k, v, g: step_pallas(s, q, k, v, g, deg=2, scale=d**-0.5, interpret=False, backend=backend)
    step = (state, x(B, 1, Hq, d), x(B, 1, H, d), x(B, 1, H, d), x(B, 1, H, dt=jnp.float32))
    return [
        ("forward", fwd, (q, kv, kv, log_g, state)),
        ("backward", bwd, (q, kv, kv, log_g, state)),
        ("decode", dec, step),
    ]


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
                jax.jit(f),
                platforms=["cuda"],
                disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
            )(*args)
            assert "__gpu$xla.gpu.triton" in exported.mlir_module(), name
