"""The GLA and gated-delta-rule Pallas kernels under a mesh on 8 host devices, in interpret mode (run by
test_eight_devices.py).

Each op with impl="pallas" under (data, fsdp, sequence) = (2, 4, 1), B = 2 and H = 4 kv-heads (8 query heads), so
the plan splits the batch over `data` and the heads over `fsdp`, equals the single-device XLA op: outputs, final
state and every gradient (q, k, v, the gates, the initial state), with packed documents; the kernels run inside
the shard_map (`matrix_state.kernels_on_mesh`).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention import gated_delta_rule, gated_linear_attention
from retention.parallel import make_mesh
from tests.helpers import rel_err
from tests.parallel.common import require_devices

require_devices()
pytestmark = pytest.mark.integration  # run by test_eight_devices.py's integration test, in its tier

TOL = 2e-5  # float32: the kernels against the XLA path
B, T, Hq, H, D = 2, 40, 8, 4, 16


def _inputs(op: str):
    """(q, k, v, *gates, initial state, segment ids): GLA's gates (log_g per channel), the delta rule's (beta,
    log_g) with unit-norm keys."""
    rng = np.random.default_rng(7)
    normal = lambda *shape: rng.standard_normal(shape)
    q, k, v = normal(B, T, Hq, D), normal(B, T, H, D), normal(B, T, H, D)
    if op == "gated_delta_rule":
        k = k / np.linalg.norm(k, axis=-1, keepdims=True)
        gates = (rng.uniform(0, 1, (B, T, H)), rng.uniform(-0.5, 0, (B, T, H)))
    else:
        gates = (rng.uniform(-0.5, 0, (B, T, H, D)),)
    arrays = tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v, *gates, normal(B, H, D, D) / 2))
    segment_ids = jnp.asarray(np.repeat([[0, 1, 2]], B, axis=0).repeat([9, 20, 11], axis=1), jnp.int32)
    return arrays, segment_ids


OPS = {"gated_linear_attention": gated_linear_attention, "gated_delta_rule": gated_delta_rule}


@pytest.mark.parametrize("name", list(OPS))
def test_op_on_mesh_equals_one_device(name):
    arrays, segment_ids = _inputs(name)
    ct_o = jnp.asarray(np.random.default_rng(8).standard_normal((B, T, Hq, D)), jnp.float32)

    def loss_and_grads(impl):
        def loss(*xs):
            *tokens, S0 = xs
            o, S = OPS[name](
                *tokens, segment_ids=segment_ids, chunk_size=16, initial_state=S0, return_state=True, impl=impl
            )
            return jnp.sum(o * ct_o) + jnp.sum(S * S), (o, S)

        return jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(arrays))), has_aux=True))

    (_, (o_want, S_want)), g_want = loss_and_grads("xla")(*arrays)
    with jax.set_mesh(make_mesh(2, 4, 1)):
        run = loss_and_grads("pallas")
        assert "shard_map" in str(jax.make_jaxpr(run)(*arrays))  # the kernels run per device
        (_, (o, S)), grads = run(*arrays)
    assert rel_err(o, o_want) < TOL and rel_err(S, S_want) < TOL
    for i, (a, b) in enumerate(zip(grads, g_want)):
        assert rel_err(a, b) < TOL, f"gradient {i}"
