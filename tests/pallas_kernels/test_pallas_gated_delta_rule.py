"""The gated delta rule's Pallas kernels (pallas_kernels/gated_delta_rule: the chunks' WY/UT operands and the
sequential pass over chunks, forward and backward), through the op layer (retention/ops/gated_delta_rule/pallas.py):
interpret mode on CPU against the float64 token recurrence, and lowering for TPU (Mosaic) and an abstract H200
(Triton).

- gpu: the GPU (Triton) variant through the public ops with impl="pallas" (which picks it on CPU): the chunked op's
  outputs, final state and the gradients in q, k, v, beta, log_g and the initial state against the float64
  recurrence's (`matrix_state_cases.check_chunked`), and the decode step fed in pieces against the recurrence's
  rows (`check_steps`), on random inputs: no decay, GQA, T not a multiple of the chunk, d_v != d_k, strong decays
  with a weak beta, packed documents (segment_ids), from an initial state; and with bf16 q, k, v (the oracle on
  the rounded values) within the bf16 tolerance;
- tpu: the TPU (Mosaic) variant through the op layer's kernel glue with backend="tpu", on the same table's chunked
  checks;
- a NaN in k, an inf in v or a NaN beta gives NaN rows exactly where the XLA path gives them, a -inf gate resets as
  there, and the other rows equal the XLA path's;
- what the kernels do not support raises, naming the argument.
The quick tier (`make test`) runs the chunked checks on every case but the one-token one, the steps on the first,
the TPU variant on the d_v != d_k case; the rest are marked slow (further cases of the same checks).
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.mesh import AbstractDevice, AbstractMesh

from retention import gated_delta_rule, gated_delta_rule_step
from retention.ops.gated_delta_rule import gated_delta_rule_recurrence
from retention.ops.gated_delta_rule.pallas import gated_delta_rule_pallas
from tests.ops.cases import _random_docs
from tests.ops.matrix_state_cases import Case, Op, check_chunked, check_steps, params

GPU = Op(
    "gated_delta_rule",
    partial(gated_delta_rule, impl="pallas"),
    partial(gated_delta_rule_step, impl="pallas"),
    gated_delta_rule_recurrence,
    "scalar",
    beta=True,
)


def _tpu_full(q, k, v, beta, log_g, *, segment_ids, chunk_size, initial_state, return_state):
    scale = q.shape[-1] ** -0.5
    o, S = gated_delta_rule_pallas(
        q, k, v, beta, log_g, initial_state, segment_ids=segment_ids, scale=scale, chunk_size=chunk_size, backend="tpu"
    )
    return (o, S) if return_state else o


TPU = Op("gated_delta_rule", _tpu_full, None, gated_delta_rule_recurrence, "scalar", beta=True)

CASES = [
    Case(1, 2, 2, 16, 16, None, 16),  # one token, no decay (the plain delta rule)
    Case(37, 4, 2, 16, 16, "weak", 16, init=True, beta="high"),  # GQA, odd T over 3 chunks, from a state
    Case(70, 2, 2, 16, 32, "strong", 32, init=True, beta="low"),  # d_v != d_k
    Case(48, 2, 1, 16, 16, "weak", 16, init=True, beta="high", docs=((1, 15, 20, 12), _random_docs(48, 7))),
]


@pytest.mark.parametrize("case", params(CASES, slow=CASES[:1]))
def test_gpu_variant_chunked(case):
    check_chunked(GPU, case)


@pytest.mark.parametrize("case", params(CASES[1:2]))
def test_gpu_variant_chunked_bf16(case):
    check_chunked(GPU, case, bf16=True)


@pytest.mark.parametrize("case", params(CASES[1:], slow=CASES[2:]))
def test_gpu_variant_steps(case):
    check_steps(GPU, case)


@pytest.mark.parametrize("case", params(CASES[1:], slow=CASES[1:2] + CASES[3:]))
def test_tpu_variant_chunked(case):
    check_chunked(TPU, case)


def test_non_finite_inputs_give_nan_rows_as_the_xla_path():
    """A NaN in k, an inf in v and a NaN beta, each in a different document of a packed row, and a -inf gate (a
    reset) in the other row: NaN from a bad token to its document's end (the final state NaN when the last document
    holds one), every other row as the XLA path."""
    rng = np.random.default_rng(4)
    B, T, Hq, H, d = 2, 40, 2, 1, 16
    q, k, v = (rng.standard_normal((B, T, h, d)) for h in (Hq, H, H))
    q, k, v = (jnp.asarray(x, jnp.float32) for x in (q, k / np.linalg.norm(k, axis=-1, keepdims=True), v))
    beta = jnp.asarray(rng.uniform(0, 1, (B, T, H)), jnp.float32)
    log_g = jnp.asarray(rng.uniform(-1, 0, (B, T, H)), jnp.float32)
    k = k.at[0, 5, 0, 3].set(jnp.nan)
    v = v.at[0, 21, 0, 0].set(jnp.inf)
    beta = beta.at[1, 33, 0].set(jnp.nan)
    log_g = log_g.at[1, 20, 0].set(-jnp.inf)
    segment_ids = jnp.asarray(np.repeat([[0, 1, 2, 3]], B, axis=0).repeat([12, 6, 10, 12], axis=1), jnp.int32)
    run = lambda impl: gated_delta_rule(
        q, k, v, beta, log_g, segment_ids=segment_ids, chunk_size=16, return_state=True, impl=impl
    )
    (o, S), (o_xla, S_xla) = run("pallas"), run("xla")
    nan_rows = np.zeros((B, T), bool)
    nan_rows[0, 5:12] = nan_rows[0, 21:28] = nan_rows[1, 33:] = True
    assert np.array_equal(np.isnan(np.asarray(o)).any(-1).any(-1), nan_rows)
    assert np.array_equal(np.isnan(np.asarray(o)), np.isnan(np.asarray(o_xla)))
    np.testing.assert_allclose(np.asarray(o)[~nan_rows], np.asarray(o_xla)[~nan_rows], rtol=2e-5, atol=2e-5)
    assert np.isfinite(np.asarray(S[0])).all() and np.isnan(np.asarray(S[1])).all()
    assert np.array_equal(np.isnan(np.asarray(S)), np.isnan(np.asarray(S_xla)))


def test_unsupported_settings_raise():
    x = lambda h, d: jnp.ones((1, 8, h, d), jnp.float32) / d
    beta = jnp.ones((1, 8, 1), jnp.float32)
    with pytest.raises(ValueError, match="impl"):
        gated_delta_rule(x(1, 16), x(1, 16), x(1, 16), beta, impl="auto")
    with pytest.raises(ValueError, match="d_k=24"):
        gated_delta_rule(x(1, 24), x(1, 24), x(1, 16), beta, impl="pallas")
    with pytest.raises(ValueError, match="d_v=8"):
        gated_delta_rule(x(1, 16), x(1, 16), x(1, 8), beta, impl="pallas")
    with pytest.raises(ValueError, match="query heads per kv-head 3"):
        gated_delta_rule(x(3, 16), x(1, 16), x(1, 16), beta, impl="pallas")


# Lowering: nothing is allocated, so realistic head dims cost only tracing time.

H200 = AbstractMesh(
    (1,), ("x",), abstract_device=AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="cuda")
)


def _kernels(d, backend):
    """(name, function, abstract args) for the forward and the backward at head dim d, bf16, GQA, packed, over 3
    chunks (a chunk count that is not a power of two)."""
    B, T, Hq, H, chunk = 1, 192, 4, 2, 64
    x = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt)
    f32 = jnp.float32
    args = (x(B, T, Hq, d), x(B, T, H, d), x(B, T, H, d), x(B, T, H, dt=f32), x(B, T, H, dt=f32), x(B, H, d, d, dt=f32))
    ids = x(B, T, dt=jnp.int32)
    fwd = lambda q, k, v, beta, g, s, ids: gated_delta_rule_pallas(
        q, k, v, beta, g, s, segment_ids=ids, scale=d**-0.5, chunk_size=chunk, backend=backend, interpret=False
    )
    loss = lambda *a: sum(y.astype(jnp.float32).sum() for y in fwd(*a))
    bwd = jax.grad(loss, argnums=(0, 1, 2, 3, 4, 5))
    return [("forward", fwd, (*args, ids)), ("backward", bwd, (*args, ids))]


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
