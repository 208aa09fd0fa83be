"""Scanned layers and remat policies: the scanned LM (its parameters converted from an unscanned one) gives the
unscanned LM's logits and gradients; every remat policy gives the gradients of none and keeps what it names;
prefill then decode of a scanned LM equals its full forward; bad scan or remat settings raise naming the field."""

import contextlib
import dataclasses
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention.nn import LM, LMConfig
from retention.nn.model import convert_layers
from retention.nn.scan import scan_state, unscan_state
from tests.helpers import rel_err

TINY = LMConfig(
    vocab_size=40,
    d_model=16,
    n_layers=2,
    pattern="P",
    n_heads=2,
    n_kv_heads=1,
    head_dim=8,
    window=5,
    chunk_size=16,
)


def fresh_seed() -> int:
    return int(np.random.SeedSequence().generate_state(1)[0] % 2**31)


def loss_and_grads(model: LM, tokens_BT, weights_BTV):
    """(logits, d sum(logits * weights) / d params) in one compiled call, the gradients as a pure dict."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
        logits = nnx.merge(graphdef, p, rest)(tokens_BT)
        return jnp.sum(logits * weights_BTV), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return logits, nnx.to_pure_dict(grads)


def inputs(config, seed, B=2, T=13):
    k1, k2 = jax.random.split(jax.random.key(seed))
    tokens = jax.random.randint(k1, (B, T), 0, config.vocab_size, dtype=jnp.int32)
    return tokens, jax.random.normal(k2, (B, T, config.vocab_size), jnp.float32)


def assert_trees_close(a, b, tol):
    """The same paths, and each leaf within relative error tol (None: exactly equal)."""
    paths_a, paths_b = jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_flatten_with_path(b)[0]
    assert [p for p, _ in paths_a] == [p for p, _ in paths_b]
    for (path, x), (_, y) in zip(paths_a, paths_b):
        if tol is None:
            np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))
        else:
            assert x.shape == y.shape and rel_err(x, y) < tol, (jax.tree_util.keystr(path), rel_err(x, y))


@pytest.mark.parametrize(
    "pattern, n_layers", [*(pytest.param(*p, marks=pytest.mark.slow) for p in (("P", 3), ("PA", 4))), ("PPPA", 4)]
)
def test_scanned_equals_unscanned(pattern, n_layers):
    """Random per-layer parameters (so a layer taken out of order changes the output), converted to the scanned
    form: the same logits and gradients (the gradients converted back), and the conversion round-trips."""
    seed = fresh_seed()
    config = dataclasses.replace(TINY, pattern=pattern, n_layers=n_layers)
    unscanned = LM(config, rngs=nnx.Rngs(seed))
    scanned = convert_layers(unscanned, True)
    assert scanned.config.scan_layers and not hasattr(scanned, "blocks")
    kernel = nnx.to_pure_dict(nnx.state(scanned, nnx.Param))["periods"]["blocks"][0]["mixer"]["q_proj"]["kernel"]
    assert kernel.shape == (n_layers // len(pattern), 16, 16)
    tokens, weights = inputs(config, seed)
    logits_u, grads_u = loss_and_grads(unscanned, tokens, weights)
    logits_s, grads_s = loss_and_grads(scanned, tokens, weights)
    assert rel_err(logits_s, logits_u) < 2e-6
    assert_trees_close(unscan_state(grads_s, config), grads_u, 2e-5)
    state = nnx.to_pure_dict(nnx.state(unscanned))
    assert_trees_close(unscan_state(scan_state(state, config), config), state, None)
    back = convert_layers(scanned, False)
    assert_trees_close(nnx.to_pure_dict(nnx.state(back)), state, None)


@pytest.mark.parametrize("scan_layers", [pytest.param(False, marks=pytest.mark.slow), True])
def test_remat_policies_give_the_gradients_of_none(scan_layers):
    seed = fresh_seed()
    config = dataclasses.replace(TINY, pattern="PA", n_layers=2, scan_layers=scan_layers)
    tokens, weights = inputs(config, seed)
    reference = loss_and_grads(LM(config, rngs=nnx.Rngs(seed)), tokens, weights)[1]
    for policy in ("full", "save_projections"):
        model = LM(dataclasses.replace(config, remat_policy=policy), rngs=nnx.Rngs(seed))
        assert_trees_close(loss_and_grads(model, tokens, weights)[1], reference, 1e-6)


def saved_residuals(config, seed) -> str:
    """What the autodiff of the unscanned LM's loss keeps for the backward pass (print_saved_residuals' lines)."""
    model = LM(config, rngs=nnx.Rngs(seed))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens, weights = inputs(config, seed)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(
            lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(tokens) * weights), params
        )
    return out.getvalue()


def test_remat_policies_keep_what_they_name():
    """save_projections keeps each layer's q/k/v/o projections by name and fewer residuals than none; full keeps
    no named projection and fewer still."""
    seed = fresh_seed()
    config = dataclasses.replace(TINY, pattern="PA", n_layers=2)
    kept = {
        p: saved_residuals(dataclasses.replace(config, remat_policy=p), seed)
        for p in ("none", "full", "save_projections")
    }
    count = {p: len(text.splitlines()) for p, text in kept.items()}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert kept["save_projections"].count(f"named '{name}'") == 2, kept["save_projections"]
        assert f"named '{name}'" not in kept["full"]
    assert count["full"] < count["save_projections"] < count["none"], count


def test_scanned_prefill_then_decode_equals_forward():
    """A scanned hybrid (P and a W window, with the short convolution's caches) prefills 17 tokens then decodes the
    rest 3 at a time (the window of 5 wraps its ring buffer): the logits of its own full forward, with the caches
    stacked over the two repeats of the period."""
    config = dataclasses.replace(TINY, pattern="PW", n_layers=4, conv_size=3, qk_norm=True, scan_layers=True)
    model = LM(config, rngs=nnx.Rngs(fresh_seed()))
    tokens = inputs(config, fresh_seed(), T=26)[0]
    full = nnx.jit(lambda m, t: m(t))(model, tokens)
    logits, caches = model.prefill(tokens[:, :17], 26, step_tokens=3)
    assert {leaf.shape[0] for leaf in jax.tree.leaves(caches.layers)} == {2}  # two repeats of the period
    pieces = [logits]
    for start in range(17, 26, 3):
        logits, caches = model.decode_step(tokens[:, start : start + 3], caches)
        pieces.append(logits)
    assert int(caches.length) == 26
    assert rel_err(jnp.concatenate(pieces, axis=1), full) < 1e-5


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(scan_layers=True, pattern="PA", n_layers=3), r"scan_layers=True needs n_layers .* got n_layers=3"),
        (dict(scan_layers="yes"), r"scan_layers must be a bool .* got 'yes'"),
        (dict(scan_layers=1), r"scan_layers must be a bool .* got 1"),
        (dict(remat_policy="some"), r"remat_policy must be one of \('none', 'full', 'save_projections', 'offload'\)"),
        (dict(remat_policy=None), r"remat_policy must be one of .* got None"),
    ],
)
def test_bad_scan_or_remat_settings_raise(changes, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **changes)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU has no host offload")
def test_offload_is_refused_on_cpu():
    config = dataclasses.replace(TINY, remat_policy="offload")  # a config is valid for any platform
    with pytest.raises(ValueError, match=r"remat_policy='offload' needs a platform .* this one is 'cpu'"):
        LM(config, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="scan_layers must be a bool"):
        convert_layers(LM(TINY, rngs=nnx.Rngs(0)), "yes")
