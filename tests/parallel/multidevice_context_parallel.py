"""Context-parallel ops on 8 host devices (run by test_eight_devices.py), the sequence split over the "sequence"
axis: power retention on its case table (tests/ops/cases.py, packed cases included: documents that start inside
a device's tokens and exactly at a device boundary) equals the single-device op and the float64 oracles (outputs,
final state, gradients); softmax attention with gathered K and V on its case table (tests/ops/attention_cases.py)
equals the float64 dense oracle (outputs, gradients); with a "tensor" axis (data x sequence x tensor) the ops'
shard_maps split the heads over it (their in_specs say so) and still equal one device and the oracles; bad
meshes, lengths and heads that the tensor axis does not divide raise clear errors."""

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from retention import RetentionState, power_retention, sympow_dim
from retention.ops import (
    causal_conv_context_parallel,
    context_parallel_size,
    power_retention_context_parallel,
    softmax_attention_context_parallel,
)
from retention.parallel import make_mesh
from tests.helpers import random_qkv, rel_err
from tests.ops import attention_cases
from tests.ops.cases import CASES, F32_TOL, case_ids, check_path, differentiate, inputs, segment_ids
from tests.parallel.common import N_DEVICES, require_devices

require_devices()
pytestmark = pytest.mark.integration  # run by test_eight_devices.py's integration test, in its tier

CP_TOL = 1e-5  # against the single-device op (float32): outputs, states, the initial state's gradients
CP_ORACLE_TOL = 1e-4  # against the float64 oracles (float32; strong gates reach ~1e-5)
CP_GRAD_TOL = 1e-4  # gradients in q, k, v, log_g against the single-device op's (strong gates: ~1e-5)


def _run(fn, *args):
    """fn(*args), compiled."""
    return jax.jit(fn)(*args)


def _sequence_devices(case) -> int:
    """The largest sequence axis (8, 4 or 2 devices) that divides T; 0 if none does (odd T)."""
    return next((n for n in (8, 4, 2) if case.T % n == 0), 0)


def _mesh_shape(case) -> tuple[int, int, int]:
    """(data, fsdp, sequence) over the 8 devices: the sequence axis as long as T allows, then data, then fsdp."""
    seq = _sequence_devices(case)
    rest = N_DEVICES // seq
    data = 2 if rest >= 2 and case.B % 2 == 0 else 1
    return data, rest // data, seq


def _supported(case) -> bool:
    """T splits over a sequence axis and B over the other axes; float32 (the bfloat16 case differs from its float32
    twin only in the local op's casts, which the single-device battery covers: left out for the suite's time)."""
    splits = _sequence_devices(case) > 0 and case.B % math.prod(_mesh_shape(case)[:2]) == 0
    return splits and case.dtype == "float32"


@pytest.mark.parametrize("case", case_ids(_supported, packed=True))
def test_power_retention_on_the_case_table(case):
    """The sequence split over `_mesh_shape(case)`: outputs, final state and gradients (q, k, v, log_g, initial
    state) against the single-device op and the float64 oracles. Odd T does not split; the rest runs."""
    _check_power_retention(case, make_mesh(*_mesh_shape(case)))


def _check_power_retention(case, mesh):
    """The op under `mesh`: outputs, final state and gradients against the single-device op and the oracles."""
    options = dict(deg=case.deg, chunk_size=case.chunk, return_state=True)

    def cp(q, k, v, log_g, state0, segment_ids=None):
        return power_retention_context_parallel(
            q, k, v, log_g, segment_ids=segment_ids, initial_state=state0, mesh=mesh, **options
        )

    def one(q, k, v, log_g, state0, segment_ids=None):
        return power_retention(q, k, v, log_g, segment_ids=segment_ids, initial_state=state0, impl="xla", **options)

    float32 = case.tol == F32_TOL
    y, state, grads = check_path(case, cp, tol=CP_ORACLE_TOL if float32 else case.tol)
    y_one, state_one, grads_one = differentiate(case, one, inputs(case)[0])
    tol, grad_tol = (CP_TOL, CP_GRAD_TOL) if float32 else (case.tol, case.tol)
    for name, a, b in (("y", y, y_one), ("S", state.S, state_one.S), ("z", state.z, state_one.z)):
        assert rel_err(a, b) < tol, name
    for name in grads:
        assert rel_err(grads[name], grads_one[name]) < (tol if name in ("S0", "z0") else grad_tol), name


def test_ambient_mesh_and_collectives():
    """Under jax.set_mesh the op finds the mesh itself; the compiled program exchanges states with
    collective-permutes (the associative scan), never gathering keys or values."""
    mesh = make_mesh(2, 1, 4)
    q, k, v, log_g = random_qkv(11, 2, 64, 2, 2, 8, gate="mild")
    with jax.set_mesh(mesh):
        assert context_parallel_size() == 4
        f = jax.jit(lambda *a: power_retention_context_parallel(*a, chunk_size=16))
        got = f(q, k, v, log_g)
        hlo = f.lower(q, k, v, log_g).compile().as_text()
    assert context_parallel_size() == 1
    assert rel_err(got, _run(lambda *a: power_retention(*a, chunk_size=16), q, k, v, log_g)) < 1e-5
    assert "collective-permute" in hlo and "all-gather" not in hlo


@pytest.mark.parametrize("case", attention_cases.case_ids(_supported))
def test_softmax_attention_on_the_case_table(case):
    """The sequence split over `_mesh_shape(case)`, K and V gathered: outputs and gradients against the float64
    dense oracle (packed: each document alone; documents start exactly at device boundaries). Odd T does not
    split; the float32 cases that do run."""
    _check_attention(case, make_mesh(*_mesh_shape(case)))


def _check_attention(case, mesh):
    """The op under `mesh`: outputs and gradients against the float64 dense oracle; K and V gathered."""
    block = {} if case.block is None else dict(block_size=case.block)

    def cp(q, k, v, segment_ids):
        return softmax_attention_context_parallel(
            q, k, v, window=case.window, segment_ids=segment_ids, mesh=mesh, **block
        )

    attention_cases.check_attention_path(case, cp)
    hlo = jax.jit(lambda *a: cp(*a, segment_ids(case))).lower(*attention_cases.inputs(case)).compile().as_text()
    assert "all-gather" in hlo


TENSOR_MESH = (2, 1, 2, 2)  # (data, fsdp, sequence, tensor): the heads split over tensor inside the ops
TENSOR_CASE = next(c for c in CASES if c.Hq > c.H and c.gate and c.init and c.docs and c.reset == "segment_ids")
ATTENTION_TENSOR_CASES = [  # full attention packed with GQA; a window crossing block edges
    next(c for c in attention_cases.CASES if c.window is None and c.docs and c.Hq > c.H),
    next(c for c in attention_cases.CASES if c.window and c.window < c.T and c.T % 2 == 0 and c.dtype == "float32"),
]


def test_power_retention_with_heads_over_tensor():
    """GQA (4 query heads on 2 kv-heads), gated, packed with segment_ids, from an initial state with the final
    state returned, on data=2 x sequence=2 x tensor=2: as on one device and as the oracles say."""
    _check_power_retention(TENSOR_CASE, make_mesh(*TENSOR_MESH))


@pytest.mark.parametrize("case", ATTENTION_TENSOR_CASES, ids=lambda case: case.id)
def test_softmax_attention_with_heads_over_tensor(case):
    """Full (packed, GQA) and windowed attention on data=2 x sequence=2 x tensor=2 against the float64 oracle."""
    _check_attention(case, make_mesh(*TENSOR_MESH))


def _shard_map_inputs(n: int, fn, *args) -> list[tuple]:
    """(in_spec, local shape) of the last n inputs of the shard_map in fn's program: the op's own (any constants
    the body closes over come first)."""
    eqn = next(e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns if e.primitive.name == "shard_map")
    specs_shapes = [(spec, var.aval.shape) for spec, var in zip(eqn.params["in_specs"], eqn.params["jaxpr"].invars)]
    return specs_shapes[-n:]


def test_the_tensor_axis_splits_the_heads_inside_the_ops():
    """With tensor=2 each op's shard_map takes q, k, v (power retention: log_g, the initial state too; the conv:
    its channels and kernel) split over "tensor" in the heads dim, so every device holds half the heads; with
    tensor among the batch axes, or no tensor axis, the heads stay whole."""
    mesh = make_mesh(*TENSOR_MESH)
    B, T, Hq, H, d = 2, 16, 4, 2, 8
    q, k, v, log_g = random_qkv(5, B, T, Hq, H, d, gate="mild")
    D = sympow_dim(d, 2)
    S0 = RetentionState(jnp.zeros((B, H, D, d), jnp.float32), jnp.zeros((B, H, D), jnp.float32))
    retention = lambda *a, **kw: power_retention_context_parallel(*a, initial_state=S0, mesh=mesh, **kw)
    (q_in, q_loc), (k_in, k_loc), (v_in, v_loc), (g_in, g_loc), (S_in, S_loc) = _shard_map_inputs(
        5, retention, q, k, v, log_g
    )
    assert q_in == k_in == v_in == P(("data", "fsdp"), "sequence", "tensor", None)
    assert g_in == P(("data", "fsdp"), "sequence", "tensor") and S_in == P(("data", "fsdp"), "tensor", None, None)
    assert q_loc[2] == Hq // 2 and k_loc[2] == v_loc[2] == g_loc[2] == S_loc[1] == H // 2
    attention = lambda *a: softmax_attention_context_parallel(*a, mesh=mesh)
    assert [(spec[2], shape[2]) for spec, shape in _shard_map_inputs(3, attention, q, k, v)] == [
        ("tensor", Hq // 2),
        ("tensor", H // 2),
        ("tensor", H // 2),
    ]
    x, w = q.reshape(B, T, Hq * d), jnp.ones((3, Hq * d), jnp.float32)
    conv = lambda x, w: causal_conv_context_parallel(x, w, mesh=mesh)
    (x_in, x_loc), _, (w_in, w_loc) = _shard_map_inputs(3, conv, x, w)
    assert (x_in[2], x_loc[2], w_in, w_loc) == ("tensor", Hq * d // 2, P(None, "tensor"), (3, Hq * d // 2))
    for whole in (dict(mesh=mesh, batch_axes=("tensor",)), dict(mesh=make_mesh(2, 1, 4, 1))):
        specs = _shard_map_inputs(4, partial(power_retention_context_parallel, **whole), q, k, v, log_g)
        assert [spec[2] for spec, _ in specs[:3]] == [None] * 3


def test_a_tensor_axis_that_does_not_divide_the_heads_is_refused():
    mesh = make_mesh(1, 1, 2, 4)
    q, k, v, log_g = random_qkv(0, 2, 16, 4, 2, 8, gate="mild")
    kv = r"k.shape\[2\] \(kv heads\) must be a multiple of the mesh axis 'tensor' of size 4, .* got 2"
    with pytest.raises(ValueError, match=kv):
        power_retention_context_parallel(q, k, v, log_g, mesh=mesh)
    with pytest.raises(ValueError, match=kv):
        softmax_attention_context_parallel(q, k, v, mesh=mesh)
    q6 = jnp.ones((2, 16, 6, 8), jnp.float32)
    with pytest.raises(ValueError, match=r"q.shape\[2\] \(query heads\) must be a multiple of .* size 4, .* got 6"):
        softmax_attention_context_parallel(q6, k, v, mesh=mesh)
    with pytest.raises(ValueError, match=r"x_BTC.shape\[2\] \(channels, heads \* head_dim\) must be .* got 6"):
        causal_conv_context_parallel(jnp.ones((2, 16, 6)), jnp.ones((3, 6)), mesh=mesh)


def test_errors_name_the_argument():
    mesh = make_mesh(1, 1, 8)
    q, k, v, log_g = random_qkv(0, 2, 20, 2, 2, 8, gate="mild")
    too_short = r"sequence length \(q.shape\[1\]\) must be a multiple of the mesh axis 'sequence' of size 8, got T=20"
    with pytest.raises(ValueError, match=too_short):
        power_retention_context_parallel(q, k, v, log_g, mesh=mesh)
    with pytest.raises(ValueError, match=r"sequence length .* of size 8, got T=20"):
        softmax_attention_context_parallel(q, k, v, mesh=mesh)
    q, k, v, log_g = random_qkv(0, 3, 16, 2, 2, 8, gate="mild")
    odd_batch = r"batch \(q.shape\[0\]\) must be a multiple of the mesh axes \('data',\) of size 2, got B=3"
    with pytest.raises(ValueError, match=odd_batch):
        power_retention_context_parallel(q, k, v, log_g, mesh=make_mesh(2, 1, 4), batch_axes=("data",))
    with pytest.raises(
        ValueError, match=r"axis must name a mesh axis, one of \('data', 'fsdp', 'sequence', 'tensor'\), got 'se"
    ):
        power_retention_context_parallel(q, k, v, log_g, mesh=mesh, axis="seq")
    with pytest.raises(ValueError, match="under jax.set_mesh"):
        power_retention_context_parallel(q, k, v, log_g)  # no mesh given, none ambient
    with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'xla', 'pallas'\)"):
        power_retention_context_parallel(q, k, v, log_g, mesh=mesh, impl="reference")


@pytest.mark.parametrize("op", ["power_retention", "softmax_attention"])
def test_a_nan_key_poisons_only_what_sees_it(op):
    """A NaN key at token 20 (on the third of 8 devices of 8 tokens), packed with a second document from token 44:
    rows before 20 are exactly those without the NaN, the first document's rows from 20 on are NaN in the query
    heads reading that kv-head (never 0), and the second document, on later devices, is untouched."""
    mesh = make_mesh(1, 1, 8)
    q, k, v, log_g = random_qkv(21, 2, 64, 4, 2, 8, gate="mild")
    seg = jnp.asarray(np.repeat([3, 8], [44, 20])[None].repeat(2, 0), jnp.int32)
    if op == "power_retention":
        run = lambda k: power_retention_context_parallel(q, k, v, log_g, segment_ids=seg, chunk_size=16, mesh=mesh)
    else:
        run = lambda k: softmax_attention_context_parallel(q, k, v, segment_ids=seg, mesh=mesh, block_size=16)
    clean, got = (np.asarray(_run(run, x)) for x in (k, k.at[:, 20, 0].set(jnp.nan)))
    assert np.array_equal(got[:, :20], clean[:, :20])
    assert np.isnan(got[:, 20:44, :2]).all() and np.isfinite(got[:, 20:44, 2:]).all()
    assert rel_err(got[:, 44:], clean[:, 44:]) < 1e-6
