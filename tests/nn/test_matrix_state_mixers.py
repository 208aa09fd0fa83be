"""The matrix-state mixers, Gated DeltaNet (D), GLA (G) and Mamba2 (M): decode steps against the full forward,
packed documents in an LM against the documents alone (prefill, then decode into a new document), cache bytes
constant in length, and one finite LM train step. (Their parameter and cache-byte formulas: tests/nn/test_registry.py,
every letter; Mamba2 against the paper's token loop: test_mamba2.py.)"""

import dataclasses

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from retention.nn import LM, GatedDeltaNet, GatedLinearAttention, Mamba2, cache_bytes
from tests.helpers import forward_and_decode_steps, rel_err
from tests.nn.test_model import DOCS, TINY, _alone, _packed, tokens

DIMS = dict(heads=4, kv_heads=2, head_dim=8)
MAMBA2_DIMS = dict(head_dim=8, state_size=6, expand=2, n_groups=2)  # 8 heads of 8, B and C of 6 in 2 groups
MIXERS = {
    "D": lambda **parts: GatedDeltaNet(32, **DIMS, **parts),
    "G": lambda **parts: GatedLinearAttention(32, **DIMS, **parts),
    "M": lambda **parts: Mamba2(32, **MAMBA2_DIMS, **parts),
}
STATE_BYTES = {"D": 4 * 2 * 8 * 8 + 4, "G": 4 * 2 * 8 * 8 + 4, "M": 4 * 8 * 6 * 8 + 4}  # per row: S and its id
CONV_CHANNELS = {"D": (4 + 2 + 2) * 8, "G": (4 + 2 + 2) * 8, "M": 64 + 2 * 2 * 6}  # q, k, v / x, B, C
M_SIZES = dict(ssm_state_size=6, ssm_groups=2)  # the LM tests' M layers (D and G ignore them)


@pytest.mark.parametrize("letter", MIXERS)
@pytest.mark.parametrize("n", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_decode_steps_equal_forward(letter, n):
    """Prefill 8 rows, then steps of n tokens (GQA, a short convolution of 4): the rows equal the full forward."""
    mixer = MIXERS[letter](conv_size=4, rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.key(2), (2, 14, 32), dtype=jnp.float32)
    full, got = forward_and_decode_steps(mixer, x, n)
    assert rel_err(got, full) < 1e-5


@pytest.mark.parametrize("letter", MIXERS)
def test_cache_bytes_are_the_state_whatever_the_length(letter):
    """S (D, G: [B, 2, 8, 8]; M: [B, 8, 6, 8]) float32 and each row's last segment id, plus the conv cache's last 3
    inputs of the convolved channels and their segment ids: the same at max_len 10 and 10^6."""
    size = lambda m, L: cache_bytes(jax.eval_shape(lambda: m.init_cache(3, L, jnp.float32)))
    plain, conv = MIXERS[letter](rngs=nnx.Rngs(0)), MIXERS[letter](conv_size=4, rngs=nnx.Rngs(0))
    assert size(plain, 10) == size(plain, 10**6) == 3 * STATE_BYTES[letter]
    assert size(conv, 10) == size(conv, 10**6) == 3 * STATE_BYTES[letter] + 3 * 3 * (4 * CONV_CHANNELS[letter] + 4)


@pytest.mark.parametrize("letter", MIXERS)
def test_packed_prefill_then_decode_equals_the_documents_alone(letter):
    """A packed prompt, 3 tokens continuing each row's last document, then a new document of 4 (a new segment id
    in decode_step): every logit equals its document run alone (the mixer and A layers, a short convolution)."""
    config = dataclasses.replace(TINY, pattern=letter + "A", conv_size=3, **M_SIZES)
    model = LM(config, rngs=nnx.Rngs(9))
    toks = tokens(10, 2, 24, config.vocab_size)
    docs = ((5, 1, 14, 4), (9, 11, 4))
    logits, caches = model.prefill(toks[:, :17], 24, segment_ids=_packed(DOCS))
    pieces = [logits]
    for t in range(17, 24):
        new_document = jnp.full((2, 1), 11, jnp.int32) if t >= 20 else None
        logits, caches = model.decode_step(toks[:, t : t + 1], caches, segment_ids=new_document)
        pieces.append(logits)
    assert rel_err(jnp.concatenate(pieces, axis=1), _alone(nnx.jit(lambda t: model(t)), toks, docs)) < 1e-5


@pytest.mark.parametrize("letter", [*(pytest.param(c, marks=pytest.mark.slow) for c in "DM"), "G"])
def test_one_lm_train_step_is_finite_and_moves_every_parameter(letter):
    """The mixer beside power retention and attention (pattern DPA, GPA, MPA): the next-token loss and every gradient
    are finite, and one AdamW step changes every parameter of the mixer's layer."""
    config = dataclasses.replace(TINY, pattern=letter + "PA", n_layers=3, conv_size=4, **M_SIZES)
    model = LM(config, rngs=nnx.Rngs(4))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    toks = tokens(5, 2, 33, config.vocab_size)

    def loss_fn(m):
        logits = m(toks[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, toks[:, 1:]).mean()

    @nnx.jit
    def step(m, opt):
        loss, grads = nnx.value_and_grad(loss_fn)(m)
        opt.update(m, grads)
        return loss, grads

    before = jax.tree.map(jnp.copy, nnx.state(model.blocks[0].mixer, nnx.Param))
    loss, grads = step(model, optimizer)
    assert bool(jnp.isfinite(loss))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    after = nnx.state(model.blocks[0].mixer, nnx.Param)
    assert all(bool(jnp.any(a != b)) for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before)))
