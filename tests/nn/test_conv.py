"""The causal short convolution: against the direct sum (numpy, float64), documents never mixed (packed equals
each document alone; a NaN stays in its document), a prefix continues the sequence exactly, and its gradients
against finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention.nn.conv import ShortConv
from retention.ops.conv import causal_conv
from tests.helpers import rel_err

SEEDS = np.random.SeedSequence().generate_state(2)  # fresh every session


def direct_conv(x_BTC, kernel_KC, segment_ids_BT=None):
    """y[b, t] = sum_i kernel[i] x[b, t - (K-1) + i] over taps inside the sequence and, with segment ids, the same
    document: the definition, one term at a time, in float64."""
    x, w = np.asarray(x_BTC, np.float64), np.asarray(kernel_KC, np.float64)
    B, T, _ = x.shape
    K = w.shape[0]
    y = np.zeros_like(x)
    for b in range(B):
        for t in range(T):
            for i in range(K):
                s = t - (K - 1) + i
                if s >= 0 and (segment_ids_BT is None or segment_ids_BT[b, s] == segment_ids_BT[b, t]):
                    y[b, t] += w[i] * x[b, s]
    return y


def random_segments(rng, B, T):
    """Ids of contiguous documents, not contiguous in value (cuts at random places, ids drawn at random)."""
    cuts = rng.random((B, T)) < 0.2
    cuts[:, 0] = False
    return (np.cumsum(cuts, axis=1) * 7 + rng.integers(0, 3, (B, 1))).astype(np.int32)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("K, T", [(1, 5), (2, 1), (4, 37), (5, 3)])
def test_matches_the_direct_sum(seed, K, T):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, T, 6)).astype(np.float32)
    w = rng.standard_normal((K, 6)).astype(np.float32)
    seg = random_segments(rng, 3, T)
    assert rel_err(causal_conv(jnp.asarray(x), jnp.asarray(w)), direct_conv(x, w)) < 2e-6
    got = causal_conv(jnp.asarray(x), jnp.asarray(w), segment_ids_BT=jnp.asarray(seg))
    assert rel_err(got, direct_conv(x, w, seg)) < 2e-6


@pytest.mark.parametrize("seed", SEEDS)
def test_packed_equals_each_document_alone(seed):
    """Rows and gradients of each document of a packed row equal those of the document run on its own; a NaN in
    one document leaves every other document's rows finite and its own earlier rows unchanged."""
    rng = np.random.default_rng(seed)
    lengths = [5, 1, 9, 2]
    x = rng.standard_normal((1, sum(lengths), 4)).astype(np.float32)
    w = jnp.asarray(rng.standard_normal((4, 4)).astype(np.float32))
    seg = jnp.asarray(np.repeat(np.arange(len(lengths)) * 3 + 1, lengths)[None].astype(np.int32))
    ct = rng.standard_normal(x.shape).astype(np.float32)
    packed_loss = lambda x, w: jnp.sum(causal_conv(x, w, segment_ids_BT=seg) * ct)
    y = causal_conv(jnp.asarray(x), w, segment_ids_BT=seg)
    gx, gw = jax.grad(packed_loss, argnums=(0, 1))(jnp.asarray(x), w)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    gw_sum = 0
    for lo, hi in zip(starts[:-1], starts[1:]):
        alone_loss = lambda x, w, lo=lo, hi=hi: jnp.sum(causal_conv(x, w) * ct[:, lo:hi])
        assert rel_err(y[:, lo:hi], causal_conv(jnp.asarray(x[:, lo:hi]), w)) < 1e-6
        gxd, gwd = jax.grad(alone_loss, argnums=(0, 1))(jnp.asarray(x[:, lo:hi]), w)
        assert rel_err(gx[:, lo:hi], gxd) < 1e-6
        gw_sum = gw_sum + gwd
    assert rel_err(gw, gw_sum) < 1e-5

    poisoned = x.copy()
    poisoned[0, starts[2] + 3, 1] = np.nan  # inside the third document
    y_nan = np.asarray(causal_conv(jnp.asarray(poisoned), w, segment_ids_BT=seg))
    third = slice(starts[2], starts[3])
    assert np.isnan(y_nan[0, starts[2] + 3 :][:4, 1]).all()  # the NaN row and the next taps of its document
    np.testing.assert_array_equal(y_nan[0, starts[2] : starts[2] + 3], np.asarray(y)[0, starts[2] : starts[2] + 3])
    others = np.ones(sum(lengths), bool)
    others[third] = False
    np.testing.assert_array_equal(y_nan[0, others], np.asarray(y)[0, others])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("K", [2, 4])
def test_a_prefix_continues_the_sequence(seed, K):
    """conv over [a, b] equals conv(a) then conv(b) with a's last K - 1 inputs as the prefix; with segment ids the
    prefix's own ids decide (a document starting at b's first token sees nothing of a)."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((2, 11, 3)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal((K, 3)).astype(np.float32))
    seg = jnp.asarray(random_segments(rng, 2, 11))
    for cut in (1, 6):
        a, b = x[:, :cut], x[:, cut:]
        prefix = jnp.pad(a, ((0, 0), (K - 1, 0), (0, 0)))[:, -(K - 1) :]
        prefix_seg = jnp.pad(seg[:, :cut], ((0, 0), (K - 1, 0)), mode="edge")[:, -(K - 1) :]
        got = causal_conv(b, w, prefix_BPC=prefix, segment_ids_BT=seg[:, cut:], prefix_segment_ids_BP=prefix_seg)
        want = causal_conv(x, w, segment_ids_BT=seg)[:, cut:]
        assert rel_err(got, want) < 1e-6
        assert rel_err(causal_conv(b, w, prefix_BPC=prefix), causal_conv(x, w)[:, cut:]) < 1e-6


def test_gradients_match_finite_differences():
    rng = np.random.default_rng(int(SEEDS[0]))
    x = jnp.asarray(rng.standard_normal((2, 7, 3)), jnp.float64)
    w = jnp.asarray(rng.standard_normal((3, 3)), jnp.float64)
    seg = jnp.asarray(random_segments(rng, 2, 7))
    ct = jnp.asarray(rng.standard_normal((2, 7, 3)), jnp.float64)
    loss = lambda x, w: jnp.sum(causal_conv(x, w, segment_ids_BT=seg) * ct)
    gx, gw = jax.grad(loss, argnums=(0, 1))(x, w)
    eps = 1e-6
    for grad, arg in ((gx, 0), (gw, 1)):
        direction = jnp.asarray(rng.standard_normal(grad.shape), jnp.float64)
        args = [x, w]
        plus, minus = list(args), list(args)
        plus[arg], minus[arg] = args[arg] + eps * direction, args[arg] - eps * direction
        fd = (loss(*plus) - loss(*minus)) / (2 * eps)
        assert abs(float(jnp.sum(grad * direction)) - float(fd)) < 1e-6 * max(1.0, abs(float(fd)))


def test_module_decode_steps_and_checks():
    """ShortConv: a full forward equals steps of 1 and 3 tokens from its cache; its cache is conv_size - 1 inputs;
    a conv_size below 1 is refused."""
    conv = ShortConv(5, 4, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 10, 5), jnp.float32)
    full, none = conv(x)
    assert none is None
    for n in (1, 3):
        cache, pieces = conv.init_cache(2), []
        assert cache.shape == (2, 3, 5)
        for lo in range(0, 10, n):
            y, cache = conv(x[:, lo : lo + n], cache=cache)
            pieces.append(y)
        assert rel_err(jnp.concatenate(pieces, axis=1), full) < 1e-6
        np.testing.assert_array_equal(cache, x[:, -3:])
    with pytest.raises(ValueError, match="conv_size must be an int >= 1, got 0"):
        ShortConv(5, 0, rngs=nnx.Rngs(0))
