"""The logical-axis rules on 8 host devices (run by test_eight_devices.py): each parameter (and its AdamW moments)
placed where its names' rules say, by a table written out here; tensor-parallel meshes (tensor x fsdp, tensor x
data, tensor alone, tensor x fsdp x sequence) giving one device's logits and gradients of a tiny P/A LM; heads
that the tensor axis does not divide refused naming them."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from retention.nn import LM, LMConfig
from retention.parallel import DEFAULT_RULES, batch_sharding, check_heads_split, make_mesh, put_batch, state_shardings
from tests.helpers import rel_err
from tests.parallel.common import require_devices

require_devices()
pytestmark = pytest.mark.integration  # run by test_eight_devices.py's integration test, in its tier

CONFIG = LMConfig(
    vocab_size=40, d_model=16, n_layers=2, pattern="PA", n_heads=8, n_kv_heads=8, head_dim=4, qk_norm=True,
    conv_size=3, tie_embeddings=False, chunk_size=16,
)  # fmt: skip


def _seed() -> int:
    return int(np.random.SeedSequence().generate_state(1)[0] % 2**31)


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def _specs(tree) -> dict[str, P]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path, simple=True, separator="."): s.spec for path, s in flat}


def test_rules_place_each_parameter_where_they_say():
    """fsdp=4 x tensor=2: d_model (16) over fsdp, heads, kv heads, MLP (40) and vocab (40) over tensor; the
    per-head channels and conv taps replicated; the moments where their parameters are, the counts replicated."""
    mesh = make_mesh(1, 4, 1, 2)
    tx = optax.adamw(1e-3)

    def init():
        params = nnx.state(LM(CONFIG, rngs=nnx.Rngs(0)))
        return {"params": params, "opt_state": tx.init(params)}

    abstract = jax.eval_shape(init)
    shardings = state_shardings(abstract, mesh)
    want = {
        "embed.embedding": P("tensor", "fsdp"),
        "head.kernel": P("fsdp", "tensor"),
        "final_norm.scale": P("fsdp"),
        "blocks.0.mixer_norm.scale": P("fsdp"),
        "blocks.0.mixer.q_proj.kernel": P("fsdp", "tensor"),
        "blocks.0.mixer.k_proj.kernel": P("fsdp", "tensor"),
        "blocks.0.mixer.o_proj.kernel": P("tensor", "fsdp"),
        "blocks.0.mixer.gate_proj.kernel": P("fsdp", "tensor"),
        "blocks.0.mixer.gate_proj.bias": P("tensor"),
        "blocks.0.mixer.conv.q.kernel": P(None, "tensor"),
        "blocks.0.mixer.qk_norm.q_norm.scale": P(),
        "blocks.1.mixer.v_proj.kernel": P("fsdp", "tensor"),
        "blocks.1.mlp.gate.kernel": P("fsdp", "tensor"),
        "blocks.1.mlp.down.kernel": P("tensor", "fsdp"),
    }
    params = _specs(shardings["params"])
    for name, spec in want.items():
        assert params[f"{name}.value"] == spec, name
    moments = shardings["opt_state"][0]
    assert _specs(moments.mu) == params and _specs(moments.nu) == params
    assert moments.count.spec == P()
    state = jax.jit(init, out_shardings=shardings)()
    q = state["params"]["blocks"][0]["mixer"]["q_proj"]["kernel"][...]
    assert q.sharding.shard_shape(q.shape) == (16 // 4, 32 // 2)


# the quick meshes split tensor with fsdp and with data; tensor alone and tensor x fsdp x sequence are further cases
SLOW = pytest.mark.slow
MESHES = [(1, 4, 1, 2), (2, 1, 1, 4), pytest.param((1, 1, 1, 8), marks=SLOW), pytest.param((1, 2, 2, 2), marks=SLOW)]


@pytest.mark.parametrize("shape", MESHES)
def test_every_mesh_gives_one_devices_logits_and_gradients(shape):
    seed = _seed()
    model = LM(CONFIG, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    keys = jax.random.split(jax.random.key(seed), 2)
    tokens = jax.random.randint(keys[0], (8, 16), 0, CONFIG.vocab_size, dtype=jnp.int32)
    targets = jax.random.randint(keys[1], (8, 16), 0, CONFIG.vocab_size, dtype=jnp.int32)

    def loss(state, tokens):
        logits = nnx.merge(graphdef, state)(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean(), logits

    step = jax.value_and_grad(loss, has_aux=True)
    (loss_one, logits_one), grads_one = jax.jit(step)(state, tokens)

    mesh = make_mesh(*shape)
    shardings = state_shardings(state, mesh)
    assert any("tensor" in s.spec for s in jax.tree.leaves(shardings))
    placed, batch = jax.device_put(state, shardings), put_batch(np.asarray(tokens), batch_sharding(mesh))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(DEFAULT_RULES):
        compiled = jax.jit(step, out_shardings=((None, None), shardings))
        (loss_mesh, logits_mesh), grads_mesh = compiled(placed, batch)
    assert logits_mesh.sharding.spec[-1] == "tensor"  # the logits' vocab axis stays split (the activation rule)
    assert rel_err(logits_mesh, logits_one) < 1e-5
    assert abs(float(loss_mesh) - float(loss_one)) < 1e-5 * abs(float(loss_one))
    assert rel_err(_flat(grads_mesh), _flat(grads_one)) < 1e-5


def test_heads_the_tensor_axis_does_not_divide_are_refused():
    mesh = make_mesh(1, 2, 1, 4)
    check_heads_split(8, 4, mesh, DEFAULT_RULES)
    with pytest.raises(ValueError, match=r"model.n_heads=6 must be a multiple of 4, the size of mesh axes 'tensor'"):
        check_heads_split(6, 2, mesh, DEFAULT_RULES)
    with pytest.raises(ValueError, match=r"model.n_kv_heads=2 must be a multiple of 4, .*\(n_heads=8, n_kv_heads=2\)"):
        check_heads_split(8, 2, mesh, DEFAULT_RULES)
