"""Context-parallel ops on 8 host devices (run by test_eight_devices.py): power retention with the sequence split
over the "sequence" axis equals the single-device op, forward, final state and gradients; the softmax baseline
with gathered K and V equals single-device softmax attention; bad meshes and lengths raise clear errors."""

import jax
import jax.numpy as jnp
import pytest

from retention import power_retention, power_retention_reference, softmax_attention
from retention.ops import (
    power_retention_context_parallel,
    sequence_parallel_size,
    softmax_attention_context_parallel,
)
from retention.parallel import make_mesh
from tests.helpers import f64, random_qkv, rel_err
from tests.parallel.common import require_devices

require_devices()


def _cotangent(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _grads(fn, cot, *args):
    """d/d(each arg) of sum(fn(*args) * cot), compiled (an eager shard_map recompiles on every call)."""
    loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float64) * cot)
    return jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)


def _run(fn, *args):
    """fn(*args), compiled."""
    return jax.jit(fn)(*args)


# (mesh (data, fsdp, sequence), B, T, Hq, H, d, deg, gate, chunk): T/n is odd-ish, padded inside each device
CASES = [
    ((1, 1, 8), 1, 200, 4, 2, 8, 2, "mild", 16),  # GQA, 25 tokens per device, 2 chunks of 16
    ((1, 2, 4), 2, 60, 2, 1, 4, 4, "strong", 16),  # degree 4, strong gates
    ((2, 2, 2), 4, 38, 2, 2, 8, 2, None, None),  # gating off, the default chunk: one chunk per device
]


@pytest.mark.parametrize("shape,B,T,Hq,H,d,deg,gate,chunk", CASES)
def test_power_retention_matches_single_device(shape, B, T, Hq, H, d, deg, gate, chunk):
    mesh = make_mesh(*shape)
    q, k, v, log_g = random_qkv(T + deg, B, T, Hq, H, d, gate=gate)
    got = _run(lambda *a: power_retention_context_parallel(*a, deg=deg, chunk_size=chunk, mesh=mesh), q, k, v, log_g)
    one = _run(lambda *a: power_retention(*a, deg=deg, chunk_size=chunk), q, k, v, log_g)
    oracle = _run(lambda *a: power_retention_reference(*a, deg=deg), *f64(q, k, v, log_g))
    assert got.dtype == jnp.float32 and got.shape == q.shape
    assert rel_err(got, one) < 1e-5
    assert rel_err(got, oracle) < 1e-4

    cot = _cotangent(7, q.shape)
    args = (q, k, v) if log_g is None else (q, k, v, log_g)  # gating off: differentiated in q, k, v only
    g_cp = _grads(lambda *a: power_retention_context_parallel(*a, deg=deg, chunk_size=chunk, mesh=mesh), cot, *args)
    g_one = _grads(lambda *a: power_retention(*a, deg=deg, chunk_size=chunk), cot, *args)
    g_ref = _grads(lambda *a: power_retention_reference(*a, deg=deg), cot, *f64(*args))
    for name, a, b, r in zip("q k v log_g".split(), g_cp, g_one, g_ref):
        assert a.dtype == jnp.float32 and a.shape == b.shape, name
        assert rel_err(a, b) < 1e-4 and rel_err(a, r) < 1e-4, name  # float32 rounding (strong gates: ~1e-5)


def test_state_in_and_out_match_single_device():
    """initial_state enters device 0 (decayed over the devices before each one); the returned state is the
    sequence's final state, the same on every device."""
    mesh = make_mesh(1, 1, 8)
    q, k, v, log_g = random_qkv(3, 2, 72, 4, 2, 8, gate="mild")
    _, state0 = _run(lambda *a: power_retention(*a, return_state=True), q[:, :40], k[:, :40], v[:, :40], log_g[:, :40])
    got, got_state = _run(lambda *a: power_retention_context_parallel(*a, initial_state=state0, return_state=True,
                                                                      chunk_size=16, mesh=mesh), q, k, v, log_g)
    want, want_state = _run(lambda *a: power_retention(*a, initial_state=state0, return_state=True, chunk_size=16),
                            q, k, v, log_g)  # fmt: skip
    assert rel_err(got, want) < 1e-5
    assert rel_err(got_state.S, want_state.S) < 1e-5 and rel_err(got_state.z, want_state.z) < 1e-5

    cot = _cotangent(1, q.shape)
    f_cp = lambda S, z, k: power_retention_context_parallel(q, k, v, log_g, initial_state=type(state0)(S, z),
                                                             mesh=mesh)  # fmt: skip
    f_one = lambda S, z, k: power_retention(q, k, v, log_g, initial_state=type(state0)(S, z))
    for name, a, b in zip(("S", "z", "k"), _grads(f_cp, cot, *state0, k), _grads(f_one, cot, *state0, k)):
        assert rel_err(a, b) < 1e-5, name


def test_ambient_mesh_and_collectives():
    """Under jax.set_mesh the op finds the mesh itself; the compiled program exchanges states with
    collective-permutes (the associative scan), never gathering keys or values."""
    mesh = make_mesh(2, 1, 4)
    q, k, v, log_g = random_qkv(11, 2, 64, 2, 2, 8, gate="mild")
    with jax.set_mesh(mesh):
        assert sequence_parallel_size() == 4
        f = jax.jit(lambda *a: power_retention_context_parallel(*a, chunk_size=16))
        got = f(q, k, v, log_g)
        hlo = f.lower(q, k, v, log_g).compile().as_text()
    assert sequence_parallel_size() == 1
    assert rel_err(got, _run(lambda *a: power_retention(*a, chunk_size=16), q, k, v, log_g)) < 1e-5
    assert "collective-permute" in hlo and "all-gather" not in hlo


@pytest.mark.parametrize("window,shape,Hq,H,T", [(None, (1, 1, 8), 4, 2, 88), (13, (2, 1, 4), 2, 2, 60)])
def test_softmax_attention_gathers_kv(window, shape, Hq, H, T):
    mesh = make_mesh(*shape)
    q, k, v, _ = random_qkv(T, 2, T, Hq, H, 8)
    run = lambda *a: softmax_attention_context_parallel(*a, window=window, mesh=mesh, block_size=16)
    got, want = _run(run, q, k, v), _run(lambda *a: softmax_attention(*a, window=window), q, k, v)
    assert rel_err(got, want) < 1e-5
    cot = _cotangent(3, q.shape)
    for name, a, b in zip("qkv", _grads(run, cot, q, k, v),
                          _grads(lambda *a: softmax_attention(*a, window=window), cot, q, k, v)):  # fmt: skip
        assert rel_err(a, b) < 1e-5, name
    hlo = jax.jit(run).lower(q, k, v).compile().as_text()
    assert "all-gather" in hlo


def test_errors_name_the_argument():
    mesh = make_mesh(1, 1, 8)
    q, k, v, log_g = random_qkv(0, 2, 20, 2, 2, 8, gate="mild")
    with pytest.raises(ValueError, match=r"sequence length \(q.shape\[1\]\) must be a multiple of the mesh axis "
                                         r"'sequence' of size 8, got T=20"):  # fmt: skip
        power_retention_context_parallel(q, k, v, log_g, mesh=mesh)
    with pytest.raises(ValueError, match=r"sequence length .* of size 8, got T=20"):
        softmax_attention_context_parallel(q, k, v, mesh=mesh)
    q, k, v, log_g = random_qkv(0, 3, 16, 2, 2, 8, gate="mild")
    with pytest.raises(ValueError, match=r"batch \(q.shape\[0\]\) must be a multiple of the mesh axes \('data',\), "
                                         r"of size 2, got B=3|batch .* got B=3"):  # fmt: skip
        power_retention_context_parallel(q, k, v, log_g, mesh=make_mesh(2, 1, 4), batch_axes=("data",))
    with pytest.raises(ValueError, match=r"axis must name a mesh axis, one of \('data', 'fsdp', 'sequence'\), got 'se"):
        power_retention_context_parallel(q, k, v, log_g, mesh=mesh, axis="seq")
    with pytest.raises(ValueError, match="under jax.set_mesh"):
        power_retention_context_parallel(q, k, v, log_g)  # no mesh given, none ambient
    with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'xla', 'pallas'\)"):
        power_retention_context_parallel(q, k, v, log_g, mesh=mesh, impl="reference")
