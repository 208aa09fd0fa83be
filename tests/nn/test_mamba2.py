"""The Mamba2 mixer (M) against an independent float64 token loop written from the paper's equations (projections,
short convolution with its bias, softplus dt, A < 0, the SSD state, D skip, gated RMSNorm per group, output
projection), on packed documents each run alone by the loop; and its sizes refused by name when they do not fit.
(Decode, packing in an LM, cache bytes and a train step: test_matrix_state_mixers.py; its formulas:
test_registry.py.)"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention.nn import LMConfig, Mamba2
from tests.helpers import rel_err

D_MODEL, P, N, EXPAND, G, K = 12, 4, 3, 2, 2, 3  # 6 heads of 4, B and C of 3 in 2 groups, 3 taps


def _softplus(x):
    return np.logaddexp(0.0, x)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _mamba2_loop(w: dict, x_TD: np.ndarray) -> np.ndarray:
    """One document, float64, token by token: the paper's Mamba2 layer from zero state and zero inputs before it."""
    T = x_TD.shape[0]
    d_inner = EXPAND * D_MODEL
    H = d_inner // P
    proj = x_TD @ w["in"]
    z, xBC, dt = proj[:, :d_inner], proj[:, d_inner : 2 * d_inner + 2 * G * N], proj[:, 2 * d_inner + 2 * G * N :]
    padded = np.concatenate([np.zeros((K - 1, xBC.shape[1])), xBC])
    conv = np.stack([sum(w["conv"][i] * padded[t + i] for i in range(K)) for t in range(T)]) + w["conv_bias"]
    xs, Bs, Cs = np.split(_silu(conv), [d_inner, d_inner + G * N], axis=1)
    dt = _softplus(dt + w["dt_bias"])  # [T, H]
    A = -np.exp(w["A_log"])
    S = np.zeros((H, N, P))
    y = np.zeros((T, H, P))
    for t in range(T):
        for h in range(H):
            g = h // (H // G)
            x_h, B_g, C_g = xs[t, h * P : (h + 1) * P], Bs[t, g * N : (g + 1) * N], Cs[t, g * N : (g + 1) * N]
            S[h] = np.exp(dt[t, h] * A[h]) * S[h] + np.outer(B_g, dt[t, h] * x_h)
            y[t, h] = S[h].T @ C_g + w["D"][h] * x_h
    gated = (y.reshape(T, d_inner) * _silu(z)).reshape(T, G, d_inner // G)
    normed = gated / np.sqrt(np.mean(gated**2, axis=-1, keepdims=True) + 1e-5)
    return (normed.reshape(T, d_inner) * w["norm_scale"]) @ w["out"]


def _weights(mixer: Mamba2) -> dict:
    """The module's parameters in float64, the three convolution kernels as one over x, B and C."""
    f64 = lambda p: np.asarray(p[...], np.float64)
    conv = np.concatenate([f64(c.kernel) for c in (mixer.conv.q, mixer.conv.k, mixer.conv.v)], axis=1)
    names = ("dt_bias", "A_log", "D", "norm_scale", "conv_bias")
    return (
        {n: f64(getattr(mixer, n)) for n in names}
        | dict(conv=conv, out=f64(mixer.out_proj.kernel))
        | {"in": f64(mixer.in_proj.kernel)}
    )


def test_mixer_equals_the_papers_token_loop_on_each_document():
    """Fresh random weights (D, dt_bias and the norm's scale moved off their initial values) and inputs; two rows of
    packed documents (odd lengths, one of a single token): every output row equals the float64 loop run on its
    document alone."""
    seed = int(np.random.SeedSequence().generate_state(1)[0] % 2**31)
    mixer = Mamba2(D_MODEL, head_dim=P, state_size=N, expand=EXPAND, n_groups=G, conv_size=K, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for name in ("D", "norm_scale", "dt_bias"):
        param = getattr(mixer, name)
        param[...] = param[...] + jnp.asarray(rng.normal(0, 0.5, param.shape), jnp.float32)
    lengths = ((7, 1, 13), (9, 12))
    T = sum(lengths[0])
    x = rng.standard_normal((2, T, D_MODEL)).astype(np.float32)
    segment_ids = jnp.asarray([np.repeat(np.arange(len(r)) * 3 + 1, r) for r in lengths], jnp.int32)
    y = jax.jit(lambda m, x, s: m(x, positions=jnp.arange(T), segment_ids=s))(mixer, jnp.asarray(x), segment_ids)
    w = _weights(mixer)
    want = np.zeros((2, T, D_MODEL))
    for b, row in enumerate(lengths):
        starts = np.cumsum((0, *row))
        for lo, hi in zip(starts[:-1], starts[1:]):
            want[b, lo:hi] = _mamba2_loop(w, x[b, lo:hi].astype(np.float64))
    assert rel_err(y, want) < 1e-5


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(d_model=18),
            r"ssm_expand \* d_model must be a multiple of head_dim .* ssm_expand=2, d_model=18, head_dim=8",
        ),
        (dict(ssm_groups=3), r"ssm_groups must divide the 8 heads .* got ssm_groups=3"),
        (dict(ssm_state_size=0), r"ssm_state_size must be an int >= 1, got 0"),
        (dict(ssm_expand=1.5), r"ssm_expand must be an int"),
    ],
)
def test_bad_sizes_raise_naming_the_field(changes, message):
    base = LMConfig(vocab_size=40, d_model=32, n_layers=2, pattern="MA", n_heads=4, n_kv_heads=4, head_dim=8)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(base, **changes)
