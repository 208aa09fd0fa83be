"""The Mosaic GPU forward (pallas_kernels/power_retention/mosaic_forward.py, `BlockSizes.forward="mosaic"`).

Mosaic GPU runs only on a GPU, so here: (a) the forward, and the gradient (its backward is the Triton one), lower
for an abstract H200 through Mosaic GPU's own lowering (layout inference and the shared-memory check included)
at several shapes; (b) its block algorithm in jnp (mosaic_emulation.py, what the op runs in interpret mode)
matches the float64 oracles (tests/ops/cases.py) on bf16 inputs at d = 64: T not a multiple of the chunk, GQA,
gates, resets, an initial state, and once with gradients through the custom VJP; (c) what it does not support
raises (float32 inputs, d or the chunk not a multiple of 64, a TPU backend, more shared memory than a Hopper
block has: at d = 128 and chunk 128 Mosaic GPU itself reports 265,240 bytes). On a GPU (no interpret mode) the
oracle tests in (b) run the Mosaic kernels themselves.
"""

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.power_retention import BlockSizes
from retention import init_state
from retention.ops.power_retention.pallas import chunked_pallas
from tests.helpers import random_qkv, rel_err
from tests.ops.cases import Case, check_path, inputs, oracle, segment_ids
from tests.pallas_kernels.test_pallas_power_retention import H200

MOSAIC = BlockSizes(state_rows=4, read_rows=None, forward="mosaic")
MOSAIC_CALL = "mosaic_gpu_v2"
TRITON_CALL = "__gpu$xla.gpu.triton"


def _mosaic_path(case: Case, blocks: BlockSizes = MOSAIC):
    def path(q, k, v, log_g, state0, segments=None):
        state = init_state(case.B, case.H, case.d) if state0 is None else state0
        return chunked_pallas(
            q,
            k,
            v,
            log_g,
            state,
            segment_ids=segments,
            deg=2,
            scale=case.d**-0.5,
            chunk_size=case.chunk,
            block_sizes=blocks,
            backend="gpu",
        )

    return path


FORWARD_CASES = [
    Case(150, 4, 2, 64, 2, "mild", 64, dtype="bfloat16", init=True, B=1, slow=True),  # GQA, 3 chunks, last padded
    Case(100, 2, 2, 64, 2, None, 64, dtype="bfloat16", B=1, slow=True),  # ungated
    Case(130, 2, 1, 64, 2, "strong", 64, dtype="bfloat16", B=1, docs=((60, 1, 10, 59),), reset="log_g", slow=True),
    Case(120, 2, 1, 64, 2, "mild", 64, dtype="bfloat16", B=2, docs=((64, 56), (3, 117))),  # a start on a boundary
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] * c.slow) for c in FORWARD_CASES])
def test_emulated_forward_matches_oracle(case):
    (q, k, v, log_g, state0), _ = inputs(case)
    packing = (segment_ids(case),) if case.docs is not None and case.reset == "segment_ids" else ()
    y, state = jax.jit(_mosaic_path(case))(q, k, v, log_g, state0, *packing)
    y_ref, (_, state_want, _) = oracle(case)
    assert y.dtype == jnp.bfloat16 and y.shape == q.shape
    errors = {"y": rel_err(y, y_ref), "S": rel_err(state.S, state_want.S), "z": rel_err(state.z, state_want.z)}
    assert all(e < case.tol for e in errors.values()), errors  # NaN fails


def test_emulated_forward_under_the_triton_backward_matches_oracle():
    case = Case(70, 2, 1, 64, 2, "mild", 64, dtype="bfloat16", init=True, B=1)
    check_path(case, _mosaic_path(case))


def _lowered(fn, args) -> str:
    with jax.sharding.use_abstract_mesh(H200):
        checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in (MOSAIC_CALL, TRITON_CALL)]
        return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()


@pytest.mark.parametrize(
    "B, T, Hq, H, d, gated, chunk",
    [
        (1, 256, 2, 1, 64, True, 128),
        pytest.param(2, 200, 2, 2, 64, False, 64, marks=pytest.mark.slow),
        pytest.param(1, 300, 8, 2, 64, True, 64, marks=pytest.mark.slow),
        (1, 256, 1, 1, 128, True, 64),
    ],
)
def test_mosaic_forward_lowers_for_h200(B, T, Hq, H, d, gated, chunk):
    x = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt)
    q, kv = x(B, T, Hq, d), x(B, T, H, d)
    log_g = x(B, T, H, dt=jnp.float32) if gated else None
    state = jax.eval_shape(lambda: init_state(B, H, d))
    blocks = BlockSizes(state_rows=max(1, 16384 // (d * d)), read_rows=None, forward="mosaic")

    def forward(q, k, v, log_g, state):
        return chunked_pallas(
            q,
            k,
            v,
            log_g,
            state,
            deg=2,
            scale=d**-0.5,
            chunk_size=chunk,
            interpret=False,
            block_sizes=blocks,
            backend="gpu",
        )

    module = _lowered(forward, (q, kv, kv, log_g, state))
    assert module.count(f"@{MOSAIC_CALL}") >= 2 and TRITON_CALL not in module  # both forward kernels, no Triton
    grad = jax.grad(lambda *a: forward(*a)[0].astype(jnp.float32).sum(), argnums=(0, 1, 2))
    module = _lowered(grad, (q, kv, kv, log_g, state))
    assert MOSAIC_CALL in module and TRITON_CALL in module  # the Mosaic forward, the Triton backward


def test_mosaic_forward_refuses_what_it_does_not_support():
    q, k, v, _ = random_qkv(0, 1, 64, 2, 2, 64)
    state = init_state(1, 2, 64)
    run = lambda q, k, v, blocks=MOSAIC, chunk=64, backend="gpu": chunked_pallas(
        q, k, v, None, state, deg=2, scale=0.125, chunk_size=chunk, block_sizes=blocks, backend=backend
    )
    with pytest.raises(ValueError, match="float32: the Mosaic GPU forward takes bfloat16 or float16"):
        run(q, k, v)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    with pytest.raises(ValueError, match="chunk_size=32: the Mosaic GPU forward needs a multiple of 64"):
        run(q, k, v, chunk=32)
    with pytest.raises(ValueError, match="backend='tpu'"):
        run(q, k, v, backend="tpu")
    with pytest.raises(ValueError, match="BlockSizes.forward must be one of"):
        BlockSizes(state_rows=4, read_rows=None, forward="cuda")
    q, k, v, _ = random_qkv(0, 1, 128, 1, 1, 128, dtype=jnp.bfloat16)
    wide = BlockSizes(state_rows=1, read_rows=None, forward="mosaic")
    with pytest.raises(ValueError, match="chunk_size=128 at d=128, state_rows=1: .* needs 265216 bytes"):
        chunked_pallas(q, k, v, None, init_state(1, 1, 128), deg=2, scale=0.1, chunk_size=128, block_sizes=wide)
    q, k, v, _ = random_qkv(0, 1, 64, 2, 2, 32, dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="d=32, e=32: the Mosaic GPU forward needs multiples of 64"):
        chunked_pallas(q, k, v, None, init_state(1, 2, 32), deg=2, scale=0.2, chunk_size=64, block_sizes=MOSAIC)


def test_mosaic_forward_lowers_inside_shard_map():
    """Under a 2-device H200 mesh (a shard_map over the batch, checking varying axes): the kernels' outputs carry
    their inputs' varying axes."""
    device = H200.abstract_device
    mesh = jax.sharding.AbstractMesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device)
    B, T, Hq, H, d = 2, 256, 4, 2, 64
    x = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt)

    def local(q, k, v, log_g):
        state = init_state(q.shape[0], H, d)
        options = dict(deg=2, scale=d**-0.5, chunk_size=128, interpret=False, block_sizes=MOSAIC, backend="gpu")
        return chunked_pallas(q, k, v, log_g, state, **options)[0]

    spec = jax.sharding.PartitionSpec("x")
    forward = lambda *a: jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=spec)(*a)
    grad = jax.grad(lambda *a: forward(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2, 3))
    args = (x(B, T, Hq, d), x(B, T, H, d), x(B, T, H, d), x(B, T, H, dt=jnp.float32))
    checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in (MOSAIC_CALL, TRITON_CALL)]
    with jax.sharding.use_abstract_mesh(mesh):
        for fn in (forward, grad):
            module = jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()
            assert MOSAIC_CALL in module and "sdy.manual_computation" in module
