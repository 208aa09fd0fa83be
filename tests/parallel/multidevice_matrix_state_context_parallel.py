"""The matrix-state ops' context-parallel forms on 8 host devices (run by test_eight_devices.py): linear attention,
GLA and the gated delta rule with the sequence split over the "sequence" axis equal the single-device op and the
float64 recurrence (outputs, final state, gradients in every input and the initial state), on (data 2, sequence 4)
and (sequence 8) meshes with odd head counts, GQA, packed documents that start inside a device's tokens and exactly
at a device boundary, and on (data 2, sequence 2, tensor 2), the heads split over tensor; the program exchanges
states by collective-permutes only; bad meshes and lengths raise ValueErrors naming the argument."""

import jax
import numpy as np
import pytest

from retention.ops import (
    context_parallel_size,
    gated_delta_rule,
    gated_delta_rule_context_parallel,
    gated_linear_attention_context_parallel,
    linear_attention,
    linear_attention_context_parallel,
)
from retention.parallel import make_mesh
from tests.helpers import random_qkv, rel_err
from tests.ops import matrix_state_cases as cases
from tests.ops.cases import segment_ids as case_segment_ids
from tests.ops.matrix_state_ops import GATED_DELTA_RULE, GLA, LINEAR_ATTENTION
from tests.parallel.common import require_devices

require_devices()
pytestmark = pytest.mark.integration  # run by test_eight_devices.py's integration test, in its tier

CP_TOL = 1e-5  # against the single-device op (float32): outputs and final state
CP_GRAD_TOL = 1e-4  # gradients against the single-device op's
CONTEXT_PARALLEL = {
    "linear_attention": linear_attention_context_parallel,
    "gated_linear_attention": gated_linear_attention_context_parallel,
    "gated_delta_rule": gated_delta_rule_context_parallel,
}
Case = cases.Case
# (mesh (data, fsdp, sequence[, tensor]), case): T = 64 is 16 tokens per device on sequence 4, 8 on sequence 8, so
# a chunk of 16 covers a whole device or more; the documents (20, 12, 32) start inside device 1 and exactly at
# device 2's first token (sequence 4), inside devices 2 and 4 (sequence 8).
MESH_CASES = [
    ((2, 1, 4), Case(64, 3, 3, 8, 6, "weak", 16, init=True, docs=((20, 12, 32), (64,)))),
    ((1, 1, 8), Case(64, 6, 3, 8, 8, "strong", 16, init=True, beta="low")),
    ((1, 1, 8), Case(64, 3, 3, 6, 8, None, 32, B=1, docs=((24, 8, 32),))),
    ((2, 1, 2, 2), Case(32, 4, 2, 8, 8, "weak", 16, init=True, docs=((10, 6, 16), (32,)))),
]
OPS = (LINEAR_ATTENTION, GLA, GATED_DELTA_RULE)


def _params():
    return [
        pytest.param(op, shape, case, id=f"{op.name}-{'x'.join(map(str, shape))}-{case.id}")
        for op in OPS
        for shape, case in MESH_CASES
        if not (op.gate == "channel" and case.gate is None)  # GLA takes a gate
    ]


def _names(op, tokens, state0) -> list[str]:
    names = [n for n, x in zip(["q", "k", "v"] + (["beta"] if op.beta else []) + ["log_g"], tokens) if x is not None]
    return names + (["state0"] if state0 is not None else [])


@pytest.mark.parametrize("op, shape, case", _params())
def test_the_split_op_equals_one_device_and_the_oracle(op, shape, case):
    """Outputs, final state and gradients of the split op against the single-device op (to float32 rounding) and
    the float64 recurrence (each document alone when packed)."""
    mesh = make_mesh(*shape)
    tokens, state0 = cases.inputs(op, case)
    ids = case_segment_ids(case)

    def path(full):
        def run(*args, segment_ids=None):
            *toks, s0 = args
            return full(*toks, segment_ids=segment_ids, chunk_size=case.chunk, initial_state=s0, return_state=True)

        return run

    cp = lambda *a, **kw: CONTEXT_PARALLEL[op.name](*a, mesh=mesh, **kw)
    o, S, grads = cases.differentiate(case, path(cp), tokens, state0, ids)
    o_one, S_one, grads_one = cases.differentiate(case, path(op.full), tokens, state0, ids)
    names = _names(op, tokens, state0)
    assert rel_err(o, o_one) < CP_TOL and rel_err(S, S_one) < CP_TOL
    for name, a, b in zip(names, grads, grads_one):
        assert rel_err(a, b) < CP_GRAD_TOL, name
    o_want, S_want, grads_want = cases.oracle(op, case)
    got = {"o": o, "S": S} | {f"d{n}": g for n, g in zip(names, grads)}
    cases._compare(got, {"o": o_want, "S": S_want} | {f"d{n}": g for n, g in zip(names, grads_want)})


def test_ambient_mesh_and_collectives():
    """Under jax.set_mesh the ops find the mesh themselves; the compiled program exchanges states with
    collective-permutes, never gathering keys or values."""
    q, k, v, log_g = random_qkv(3, 2, 32, 2, 2, 8, gate="mild")
    beta = jax.nn.sigmoid(q[..., 0])
    runs = [
        (linear_attention, linear_attention_context_parallel, (q, k, v, log_g)),
        (gated_delta_rule, gated_delta_rule_context_parallel, (q, k, v, beta, log_g)),
    ]
    for one, cp, args in runs:
        with jax.set_mesh(make_mesh(2, 1, 4)):
            assert context_parallel_size() == 4
            f = jax.jit(lambda *a, cp=cp: cp(*a, chunk_size=16))
            got = f(*args)
            hlo = f.lower(*args).compile().as_text()
        assert rel_err(got, jax.jit(lambda *a, one=one: one(*a, chunk_size=16))(*args)) < CP_TOL
        assert "collective-permute" in hlo and "all-gather" not in hlo


def test_errors_name_the_argument():
    q, k, v, log_g = random_qkv(0, 2, 20, 3, 3, 8, gate="mild")
    beta = jax.nn.sigmoid(q[..., 0])
    mesh = make_mesh(1, 1, 8)
    too_short = r"sequence length \(q.shape\[1\]\) must be a multiple of the mesh axis 'sequence' of size 8, got T=20"
    with pytest.raises(ValueError, match=too_short):
        linear_attention_context_parallel(q, k, v, log_g, mesh=mesh)
    with pytest.raises(ValueError, match=too_short):
        gated_delta_rule_context_parallel(q, k, v, beta, log_g, mesh=mesh)
    q, k, v, log_g = random_qkv(0, 3, 16, 3, 3, 8, gate="mild")
    odd_batch = r"batch \(q.shape\[0\]\) must be a multiple of the mesh axes \('data',\) of size 2, got B=3"
    with pytest.raises(ValueError, match=odd_batch):
        linear_attention_context_parallel(q, k, v, log_g, mesh=make_mesh(2, 1, 4), batch_axes=("data",))
    with pytest.raises(ValueError, match=r"axis must name a mesh axis, one of \('data', 'fsdp', 'sequence', 'tens"):
        linear_attention_context_parallel(q, k, v, log_g, mesh=mesh, axis="seq")
    with pytest.raises(ValueError, match="under jax.set_mesh"):
        linear_attention_context_parallel(q, k, v, log_g)  # no mesh given, none ambient
    with pytest.raises(ValueError, match=r"q.shape\[2\] \(query heads\) must be a multiple of the mesh axis 'tensor'"):
        linear_attention_context_parallel(q[:2], k[:2], v[:2], log_g[:2], mesh=make_mesh(1, 1, 4, 2))
    with pytest.raises(ValueError, match=r"log_g must be an array \[B, T, H, d_k\]"):
        gated_linear_attention_context_parallel(q, k, v, None, mesh=mesh)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
        gated_delta_rule_context_parallel(q, k, v, np.full(k.shape[:3], 2.0, np.float32), mesh=mesh)


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_a_nan_key_poisons_only_what_sees_it(op):
    """A NaN key at token 20 (on the third of 8 devices of 8 tokens), packed with a second document from token 44
    (inside the sixth device): rows before 20 are exactly those without the NaN, the first document's rows from 20
    on are NaN in the query heads reading that kv-head, and the second document, on later devices, is untouched."""
    case = Case(64, 4, 2, 8, 8, "weak", 16, docs=((44, 20), (44, 20)))
    tokens, _ = cases.inputs(op, case)
    mesh = make_mesh(1, 1, 8)
    ids = case_segment_ids(case)
    run = lambda k: CONTEXT_PARALLEL[op.name](tokens[0], k, *tokens[2:], segment_ids=ids, chunk_size=16, mesh=mesh)
    clean, got = (np.asarray(jax.jit(run)(k)) for k in (tokens[1], tokens[1].at[:, 20, 0].set(np.nan)))
    assert np.array_equal(got[:, :20], clean[:, :20])
    assert np.isnan(got[:, 20:44, :2]).all() and np.isfinite(got[:, 20:44, 2:]).all()
    assert rel_err(got[:, 44:], clean[:, 44:]) < 1e-6
