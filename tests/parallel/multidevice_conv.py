"""The short convolution's context-parallel halo on 8 host devices (run by test_eight_devices.py): with the tokens
split over the "sequence" axis, the convolution (with and without segment ids, its gradients; also with its
channels split over a "tensor" axis) and a whole LM with `conv_size` 4 (P, A and W layers, the train step's
forward) equal one device; the matrix-state mixers (D, G, M) under a data and FSDP mesh, and under a (data,
sequence, tensor) mesh (their context-parallel ops and convolution), equal one device; too few tokens per device
raise."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention.nn import LM, LMConfig
from retention.ops.conv import causal_conv, causal_conv_context_parallel
from retention.parallel import batch_sharding, make_mesh, put_batch, state_shardings
from tests.helpers import rel_err
from tests.parallel.common import require_devices

require_devices()
pytestmark = pytest.mark.integration  # run by test_eight_devices.py's integration test, in its tier

SEED = int(np.random.SeedSequence().generate_state(1)[0] % 2**31)  # fresh every session


@pytest.mark.parametrize(
    "K, shape",
    [(4, (1, 1, 8)), (3, (2, 1, 4)), (4, (2, 1, 2, 2)), pytest.param(1, (1, 1, 8), marks=pytest.mark.slow)],
)
def test_conv_equals_one_device(K, shape):
    """Outputs and gradients (x, kernel) of the split convolution equal the single-device one; with segment ids
    whose documents cross device boundaries, the halo's ids keep documents apart. (data, fsdp, sequence, tensor) =
    (2, 1, 2, 2): the channels split over tensor too."""
    rng = np.random.default_rng(SEED + K)
    B, T, C = 2, 40, 6
    x = jnp.asarray(rng.standard_normal((B, T, C)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal((K, C)).astype(np.float32))
    cuts = rng.random((B, T)) < 0.15
    seg = jnp.asarray((np.cumsum(cuts, axis=1) * 5 + 2).astype(np.int32))
    cot = jnp.asarray(rng.standard_normal((B, T, C)).astype(np.float32))
    mesh = make_mesh(*shape)
    for segment_ids in (None, seg):
        cp = lambda x, w, s=segment_ids: causal_conv_context_parallel(x, w, segment_ids_BT=s, mesh=mesh)
        one = lambda x, w, s=segment_ids: causal_conv(x, w, segment_ids_BT=s)
        assert rel_err(jax.jit(cp)(x, w), one(x, w)) < 1e-6
        grad = lambda f: jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w) * cot), argnums=(0, 1)))(x, w)
        for a, b in zip(grad(cp), grad(one)):
            assert rel_err(a, b) < 1e-6


@pytest.mark.slow  # a further case: the op on 8 devices (above), an LM with conv in the sharded step (multidevice_step)
def test_lm_with_conv_equals_one_device():
    """An LM of P, A and W layers with conv_size 4 under a mesh splitting 128 tokens over 8 devices (one chunk of
    16 each): its logits and parameter gradients equal the single-device forward."""
    config = LMConfig(
        vocab_size=37,
        d_model=32,
        n_layers=3,
        pattern="PAW",
        window=5,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        chunk_size=16,
        conv_size=4,
        qk_norm=True,
    )
    model = LM(config, rngs=nnx.Rngs(SEED))
    tokens = jax.random.randint(jax.random.key(SEED), (2, 128), 0, config.vocab_size, dtype=jnp.int32)
    loss = lambda m, t: jnp.mean(jax.nn.logsumexp(m(t), axis=-1))
    one_logits = nnx.jit(lambda m, t: m(t))(model, tokens)
    one_grads = nnx.jit(nnx.grad(loss))(model, tokens)
    with jax.set_mesh(make_mesh(1, 1, 8)):
        cp_logits = nnx.jit(lambda m, t: m(t))(model, tokens)
        cp_grads = nnx.jit(nnx.grad(loss))(model, tokens)
    assert rel_err(cp_logits, one_logits) < 1e-5
    for a, b in zip(jax.tree.leaves(cp_grads), jax.tree.leaves(one_grads)):
        assert rel_err(a, b) < 1e-4


def test_matrix_state_mixers_on_a_data_and_fsdp_mesh_equal_one_device():
    """D, G and M layers (with the short convolution) under a (data, fsdp) = (2, 4) mesh, parameters FSDP-sharded
    and the batch's rows split over both axes: the logits equal the single-device forward (the sequence stays whole)."""
    config = LMConfig(
        vocab_size=37,
        d_model=32,
        n_layers=3,
        pattern="DGM",
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        chunk_size=16,
        conv_size=4,
        ssm_state_size=6,
        ssm_groups=2,
    )
    model = LM(config, rngs=nnx.Rngs(SEED))
    tokens = jax.random.randint(jax.random.key(SEED), (8, 40), 0, config.vocab_size, dtype=jnp.int32)
    forward = lambda graphdef, state, t: nnx.merge(graphdef, state)(t)
    graphdef, state = nnx.split(model)
    one = jax.jit(forward, static_argnums=0)(graphdef, state, tokens)
    mesh = make_mesh(2, 4, 1)
    sharded = jax.device_put(state, state_shardings(state, mesh))
    assert any("fsdp" in x.sharding.spec for x in jax.tree.leaves(sharded))
    with jax.set_mesh(mesh):
        logits = jax.jit(forward, static_argnums=0)(graphdef, sharded, put_batch(tokens, batch_sharding(mesh)))
    assert rel_err(logits, one) < 1e-5


def test_matrix_state_mixers_on_a_sequence_and_tensor_mesh_equal_one_device():
    """D, G and M layers with the short convolution under (data, sequence, tensor) = (2, 2, 2): the context-parallel
    ops and convolution, the heads (and the convolution's channels) split over tensor inside them; the logits and
    the parameters' gradients equal the single-device forward's."""
    config = LMConfig(
        vocab_size=37, d_model=32, n_layers=3, pattern="DGM", n_heads=4, n_kv_heads=2, head_dim=8, chunk_size=16,
        conv_size=4, ssm_state_size=4, ssm_groups=2,
    )  # fmt: skip
    model = LM(config, rngs=nnx.Rngs(SEED))
    tokens = jax.random.randint(jax.random.key(SEED), (2, 40), 0, config.vocab_size, dtype=jnp.int32)
    loss = lambda m, t: jnp.mean(jax.nn.logsumexp(m(t), axis=-1))
    one_logits = nnx.jit(lambda m, t: m(t))(model, tokens)
    one_grads = nnx.jit(nnx.grad(loss))(model, tokens)
    with jax.set_mesh(make_mesh(2, 1, 2, tensor=2)):
        cp_logits = nnx.jit(lambda m, t: m(t))(model, tokens)
        cp_grads = nnx.jit(nnx.grad(loss))(model, tokens)
    assert rel_err(cp_logits, one_logits) < 1e-5
    for a, b in zip(jax.tree.leaves(cp_grads), jax.tree.leaves(one_grads)):
        assert rel_err(a, b) < 1e-4


def test_too_few_tokens_per_device():
    x = jnp.ones((1, 16, 3))
    with pytest.raises(ValueError, match=r"conv_size=4 needs at least conv_size - 1 = 3 tokens per device .* got T=16"):
        causal_conv_context_parallel(x, jnp.ones((4, 3)), mesh=make_mesh(1, 1, 8))
