"""The LM: prefill-then-decode equals the full forward, causality, cache sizes, one compile, config checks."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from retention.nn import LM, LMConfig, cache_bytes, count_params, flops_per_token, size_config
from retention.nn import model as model_module
from tests.helpers import rel_err

TINY = LMConfig(
    vocab_size=50,
    d_model=32,
    n_layers=2,
    pattern="A",
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    window=5,
    gating=True,
    chunk_size=16,
)


def tokens(key, B, T, vocab):
    return jax.random.randint(jax.random.key(key), (B, T), 0, vocab, dtype=jnp.int32)


@pytest.mark.parametrize(
    "pattern, conv_size",
    [
        *(pytest.param(*p, marks=pytest.mark.slow) for p in (("A", 0), ("P", 0), ("P", 4))),
        ("W", 4),
        ("PPPA", 4),
        # a further case: every matrix-state mixer's LM prefill and decode is in test_matrix_state_mixers
        pytest.param("DA", 4, marks=pytest.mark.slow),
    ],
)
def test_prefill_then_decode_equals_forward(pattern, conv_size):
    """Prefill 17 tokens (the chunked path for P: past the chunk of 16), then decode the other 12 one at a time
    and 3 at a time; the window of 5 makes the W ring buffer wrap. Logits equal one full forward of 29."""
    config = dataclasses.replace(
        TINY, pattern=pattern, n_layers=max(2, len(pattern)), qk_norm=True, conv_size=conv_size
    )
    model = LM(config, rngs=nnx.Rngs(1))
    toks = tokens(2, 2, 29, config.vocab_size)
    full = nnx.jit(lambda m, t: m(t))(model, toks)
    assert bool(jnp.all(jnp.isfinite(full)))
    for n in (1, 3):
        logits, caches = model.prefill(toks[:, :17], 29, step_tokens=n)
        pieces = [logits]
        for start in range(17, 29, n):
            logits, caches = model.decode_step(toks[:, start : start + n], caches)
            pieces.append(logits)
        assert int(caches.length) == 29
        assert rel_err(jnp.concatenate(pieces, axis=1), full) < 1e-5, (pattern, n)


@pytest.mark.parametrize("T", [23, pytest.param(32, marks=pytest.mark.slow)])
def test_causal(T):
    """The gradient of the logits at position t w.r.t. the input embeddings after t is exactly zero (P, W and A
    layers; T=32 fills two chunks of 16, T=23 pads the second)."""
    config = dataclasses.replace(TINY, pattern="PWA", n_layers=3)
    model = LM(config, rngs=nnx.Rngs(3))
    t = 11
    x = jax.random.normal(jax.random.key(4), (2, T, config.d_model), dtype=jnp.float32)
    w = jax.random.normal(jax.random.key(5), (2, config.vocab_size), dtype=jnp.float32)
    positions = jnp.arange(T, dtype=jnp.int32)

    def logit_t(x):
        return jnp.sum(model.forward_embeddings(x, positions=positions)[0][:, t] * w)

    grad = jax.jit(jax.grad(logit_t))(x)
    assert bool(jnp.all(grad[:, t + 1 :] == 0))
    assert bool(jnp.all(jnp.any(grad[:, : t + 1] != 0, axis=(0, 2))))  # every earlier position matters


def test_cache_bytes_constant_for_retention_growing_for_attention():
    """Shapes only (jax.eval_shape): a P model's caches are the same size at any max_len, an A model's grow
    linearly, a W model's are window-sized."""
    sizes = {}
    for pattern in ("P", "A", "W"):
        model = LM(dataclasses.replace(TINY, pattern=pattern), rngs=nnx.Rngs(0))
        shapes = [jax.eval_shape(lambda m=model, L=L: m.init_caches(2, L)) for L in (64, 4096, 1 << 20)]
        sizes[pattern] = [cache_bytes(s) for s in shapes]
    assert sizes["P"][0] == sizes["P"][1] == sizes["P"][2]
    assert sizes["W"][0] == sizes["W"][1] == sizes["W"][2]
    assert sizes["A"][0] < sizes["A"][1] < sizes["A"][2]
    assert sizes["A"][2] - sizes["A"][1] == (sizes["A"][1] - sizes["A"][0]) * ((1 << 20) - 4096) // (4096 - 64)


def test_decode_compiles_once():
    """Many decode steps of one shape trace the compiled step once: the position is the cache's traced length."""
    config = dataclasses.replace(TINY, vocab_size=53, pattern="PA")  # a config no other test compiles
    model = LM(config, rngs=nnx.Rngs(6))
    toks = tokens(7, 1, 21, config.vocab_size)
    _, caches = model.prefill(toks[:, :5], 21)
    before = model_module._decode._cache_size()
    for i in range(5, 21):
        _, caches = model.decode_step(toks[:, i : i + 1], caches)
    assert model_module._decode._cache_size() - before == 1
    # the state after the steps is finite and the P layer's state did not change shape
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(caches))


@pytest.mark.parametrize(
    "field, value",
    [
        ("pattern", "PXA"),
        ("pattern", ""),
        ("n_heads", 6),  # with n_kv_heads=4
        ("window", 0),
        ("window", -3),
        ("deg", 3),
        ("d_model", 0),
        ("vocab_size", -1),
        ("n_layers", 0),
        ("head_dim", 0),
        ("chunk_size", 48),
        ("dtype", "int8"),
        ("param_dtype", "float64"),
        ("mlp_ratio", 0),
        ("conv_size", -1),
        ("conv_size", True),
        ("gate_bias_init", float("inf")),
        ("retention_impl", "cuda"),
        ("retention_impl", "cudnn"),  # an attention path
        ("attention_impl", "pallas"),  # a retention path
        ("mlp_width", -1),  # 0: no MLP (test_blocks_without_mlp_are_blocks_whose_mlp_gives_zero)
        ("norm_eps", 0.0),
        ("qkv_bias", 1),
        ("rope_scaling", "yarn"),
        ("rope_factor", 0.5),  # with rope_scaling="linear"
        ("rope_high_freq_factor", 0.5),  # below rope_low_freq_factor=1 with rope_scaling="llama3"
        ("rope_original_max_len", 0),  # with rope_scaling="llama3"
    ],
)
def test_config_validation(field, value):
    base = dict(n_heads=8, n_kv_heads=4)
    if field.startswith("rope_") and field != "rope_scaling":
        base["rope_scaling"] = "linear" if field == "rope_factor" else "llama3"
    with pytest.raises(ValueError, match=field) as info:
        LMConfig(**{**base, field: value})
    assert repr(value) in str(info.value) or str(value) in str(info.value)


@pytest.mark.parametrize("pattern, n_layers", [("PPPA", 2), ("PPPA", 3), ("PWA", 2), ("AP", 1)])
def test_pattern_longer_than_the_layers_is_refused(pattern, n_layers):
    """A pattern cut to fewer layers than letters would drop a mixer silently: an error naming both fields."""
    with pytest.raises(ValueError, match=rf"pattern={pattern!r} needs n_layers >= {len(pattern)}.*n_layers={n_layers}"):
        dataclasses.replace(TINY, pattern=pattern, n_layers=n_layers)


@pytest.mark.parametrize("pattern, n_layers, kinds", [("PPPA", 4, "PPPA"), ("PPPA", 6, "PPPAPP"), ("PA", 5, "PAPAP")])
def test_layer_kinds_repeat_the_pattern(pattern, n_layers, kinds):
    assert dataclasses.replace(TINY, pattern=pattern, n_layers=n_layers).layer_kinds == kinds


def test_impls_reach_their_mixers():
    """retention_impl goes to every P layer, attention_impl to every A and W layer; the op's own values are valid
    config values (pallas for retention, cudnn for attention)."""
    config = dataclasses.replace(TINY, pattern="PAWP", n_layers=4, retention_impl="reference", attention_impl="xla")
    model = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
    assert [block.mixer.impl for block in model.blocks] == ["reference", "xla", "xla", "reference"]
    config = dataclasses.replace(config, retention_impl="xla", attention_impl="reference")
    model = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
    assert [block.mixer.impl for block in model.blocks] == ["xla", "reference", "reference", "xla"]
    dataclasses.replace(config, retention_impl="pallas", attention_impl="cudnn")  # accepted by the config


def test_param_count_and_size_config():
    """count_params agrees with the built model; size_config matches softmax, power and hybrid to 2 %."""
    variants = [("A", True, False, True, 0), ("PPPA", True, True, False, 4), ("PW", False, True, True, 2)]
    for pattern, gating, qk_norm, tied, conv_size in variants:
        config = dataclasses.replace(
            TINY, pattern=pattern, n_layers=4, gating=gating, qk_norm=qk_norm, tie_embeddings=tied, conv_size=conv_size
        )
        assert LM(config, rngs=nnx.Rngs(0)).param_count() == count_params(config)
    target = 3_000_000
    base = LMConfig(vocab_size=256, n_layers=6, n_heads=4, n_kv_heads=2, head_dim=32)
    for pattern in ("A", "P", "PPPA"):
        sized = size_config(dataclasses.replace(base, pattern=pattern), target)
        assert abs(count_params(sized) - target) / target < 0.02, (pattern, sized.d_model)


def test_blocks_without_mlp_are_blocks_whose_mlp_gives_zero():
    """mlp_width 0 (Mamba2's blocks): x + mixer(norm(x)) alone, no MLP and no second norm; the logits are those of
    the same parameters in blocks whose MLP's down projection is zero, the parameter count is the config's, and the
    scanned form gives the same logits."""
    config = dataclasses.replace(TINY, pattern="MA", mlp_width=0, ssm_state_size=4, conv_size=3, tie_embeddings=False)
    bare = LM(config, rngs=nnx.Rngs(0))
    assert all(block.mlp is None and block.mlp_norm is None for block in bare.blocks)
    full = LM(dataclasses.replace(config, mlp_width=16), rngs=nnx.Rngs(1))
    assert bare.param_count() == count_params(config) == count_params(full.config) - 2 * (3 * 32 * 16 + 32)
    pure, kept = nnx.to_pure_dict(nnx.state(full)), nnx.to_pure_dict(nnx.state(bare))
    for name in ("embed", "final_norm", "head"):
        pure[name] = kept[name]
    for i, block in kept["blocks"].items():
        pure["blocks"][i] |= block
        pure["blocks"][i]["mlp"]["down"]["kernel"] = jnp.zeros_like(pure["blocks"][i]["mlp"]["down"]["kernel"])
    state = nnx.state(full)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(full, state)
    toks = tokens(3, 2, 9, config.vocab_size)
    assert jnp.array_equal(bare(toks), full(toks))
    assert rel_err(model_module.convert_layers(bare, True)(toks), bare(toks)) < 1e-6


def test_flops_per_token():
    """Softmax cost per token grows with T, retention's and the window's do not once T passes chunk and window."""
    config = dataclasses.replace(TINY, n_layers=4)
    flops = {p: [flops_per_token(dataclasses.replace(config, pattern=p), T) for T in (256, 4096)] for p in "APW"}
    assert flops["A"][1] > flops["A"][0]
    assert flops["P"][1] == flops["P"][0] and flops["W"][1] == flops["W"][0]
    d, Hq, H = config.head_dim, config.n_heads, config.n_kv_heads
    matmuls = flops_per_token(config, 1) - 4 * 2 * 1 * d * Hq  # T=1: the A layers' attention is 2*1*d per head
    assert flops["A"][0] - matmuls == 4 * 2 * 256 * d * Hq
    D = 36  # C(8 + 1, 2)
    gate = 2 * config.d_model * H * 4
    assert flops["P"][0] - matmuls - gate == 4 * (2 * D * d * (H + Hq) + 2 * 16 * d * Hq)
    conv = dataclasses.replace(config, conv_size=3)
    for p in "APW":  # 2 FLOPs per tap, channel and token, in each layer
        extra = flops_per_token(dataclasses.replace(conv, pattern=p), 256) - flops[p][0]
        assert extra == 4 * 2 * 3 * (Hq + 2 * H) * d


DOCS = ((5, 1, 11), (9, 8))  # per row: document lengths (a one-token document; the last ones continue in decode)


def _packed(docs, ids=(4, 9, 2)):
    """segment ids [B, T] for per-row document lengths (non-consecutive ids)."""
    return jnp.asarray([[ids[i] for i, n in enumerate(row) for _ in range(n)] for row in docs], jnp.int32)


def _alone(forward, toks, docs):
    """Each document run alone, all in one batch through forward(tokens [R, L]) -> logits [R, L, V]: one document
    per row, padded at its end (a causal model: padding after a token never changes its logits), then put back."""
    spans = [(b, sum(row[:i]), n) for b, row in enumerate(docs) for i, n in enumerate(row)]
    L = max(n for _, _, n in spans)
    rows = jnp.stack([jnp.pad(toks[b, s : s + n], (0, L - n)) for b, s, n in spans])
    logits = forward(rows)
    back = [[logits[r, :n] for r, (b_r, _, n) in enumerate(spans) if b_r == b] for b in range(len(docs))]
    return jnp.stack([jnp.concatenate(row) for row in back])


def test_packed_forward_and_gradients_equal_the_documents_alone():
    """Packed rows (RoPE positions restarting, every mixer and its short convolution kept to its document): the
    logits of each document and the gradient of a loss summed over the documents equal running the documents one
    by one."""
    config = dataclasses.replace(TINY, pattern="PWA", n_layers=3, conv_size=3)
    model = LM(config, rngs=nnx.Rngs(6))
    toks, seg = tokens(7, 2, 17, config.vocab_size), _packed(DOCS)
    ct = jax.random.normal(jax.random.key(8), (2, 17, config.vocab_size))
    loss_packed = lambda m: jnp.vdot(m(toks, segment_ids=seg), ct)
    loss_alone = lambda m: jnp.vdot(_alone(m, toks, DOCS), ct)
    assert (
        rel_err(nnx.jit(lambda m: m(toks, segment_ids=seg))(model), _alone(nnx.jit(lambda t: model(t)), toks, DOCS))
        < 1e-5
    )
    g_packed = nnx.state(nnx.jit(nnx.grad(loss_packed))(model), nnx.Param)
    g_alone = nnx.state(nnx.jit(nnx.grad(loss_alone))(model), nnx.Param)
    for a, b in zip(jax.tree.leaves(g_packed), jax.tree.leaves(g_alone)):
        assert rel_err(a, b) < 1e-4


def test_packed_prefill_then_decode_equals_the_documents_alone():
    """Prefill a packed prompt, decode 3 tokens continuing each row's last document, then a new document of 4
    tokens (a new segment id in decode_step): every logit equals its document run alone (P, W, A layers, each
    with a short convolution, whose cache must not reach into the new document)."""
    config = dataclasses.replace(TINY, pattern="PWA", n_layers=3, conv_size=3)
    model = LM(config, rngs=nnx.Rngs(9))
    toks = tokens(10, 2, 24, config.vocab_size)
    docs = ((5, 1, 14, 4), (9, 11, 4))  # prompt 17 + 3 continuing the last prompt document, then a new one of 4
    logits, caches = model.prefill(toks[:, :17], 24, segment_ids=_packed(DOCS))
    pieces = [logits]
    for t in range(17, 24):
        new_document = jnp.full((2, 1), 11, jnp.int32) if t >= 20 else None  # None: continue the document
        logits, caches = model.decode_step(toks[:, t : t + 1], caches, segment_ids=new_document)
        pieces.append(logits)
    assert rel_err(jnp.concatenate(pieces, axis=1), _alone(nnx.jit(lambda t: model(t)), toks, docs)) < 1e-5


def test_token_ids_and_segment_ids_are_checked():
    """Concrete ids outside [0, vocab_size) raise ValueError; traced ones with debug_checks raise from inside jit;
    segment_ids of the wrong shape raise before any work."""
    model = LM(TINY, rngs=nnx.Rngs(0))
    bad = jnp.asarray([[1, 2, 50, 3]], jnp.int32)
    with pytest.raises(ValueError, match=r"tokens must be ids in \[0, vocab_size=50\), got \[50\]"):
        model(bad)
    with pytest.raises(ValueError, match=r"segment_ids must have shape \[B, T\] = \(1, 4\), got \(1, 3\)"):
        model(bad.at[0, 2].set(0), segment_ids=jnp.zeros((1, 3), jnp.int32))
    with pytest.raises(Exception, match=r"tokens must be ids in \[0, vocab_size=50\) \(debug_checks\), got 1 outside"):
        jax.block_until_ready(
            nnx.jit(lambda m, t: m(t, debug_checks=True))(model, bad.at[0, 0].set(-5).at[0, 2].set(0))
        )


@pytest.mark.parametrize("pattern", [*(pytest.param(p, marks=pytest.mark.slow) for p in ("P", "A", "PW", "W")), "PA"])
def test_decode_after_a_short_last_document_continues_only_that_document(pattern):
    """A packed prompt whose last document has 1 or 2 tokens, fewer than conv_size - 1 = 3, then decode steps with
    segment_ids None (continue each row's last document): every logit of that document equals the document run
    alone (the convolution never reads the previous document's inputs from its cache)."""
    config = dataclasses.replace(TINY, pattern=pattern, n_layers=max(2, len(pattern)), conv_size=4, window=3)
    model = LM(config, rngs=nnx.Rngs(11))
    alone = nnx.jit(lambda m, t: m(t))
    for last in (1, 2):
        docs = ((7, last), (4, 3, last))
        T = sum(docs[0])
        toks = tokens(12 + last, 2, T + 4, config.vocab_size)
        logits, caches = model.prefill(toks[:, :T], T + 4, segment_ids=_packed(docs))
        pieces = [logits[:, T - last :]]
        for t in range(T, T + 4):
            logits, caches = model.decode_step(toks[:, t : t + 1], caches)
            pieces.append(logits)
        want = alone(model, toks[:, T - last :])
        assert rel_err(jnp.concatenate(pieces, axis=1), want) < 1e-5, (pattern, last)


@pytest.mark.parametrize(
    "pattern, bits", [("P", None), ("A", None), pytest.param("W", None, marks=pytest.mark.slow), ("A", 8)]
)
def test_an_id_that_comes_back_starts_a_new_document_in_every_layer_kind(pattern, bits):
    """A segment id that comes back (under jit inside one call, or in a later decode step) starts a new document
    in every layer kind and in the convolution: logits equal those of the ids renumbered 0, 1, 2, ... (attention
    rejoined the earlier run, retention started afresh). Known values are refused; a quantized KV cache holds one
    document per row and refuses segment ids."""
    config = dataclasses.replace(TINY, pattern=pattern, conv_size=3, window=4, kv_cache_bits=bits)
    model = LM(config, rngs=nnx.Rngs(13))
    toks = tokens(14, 2, 14, config.vocab_size)
    ids = lambda runs: jnp.asarray([[i for i, n in runs for _ in range(n)]] * 2, jnp.int32)
    returning, numbered = ids([(5, 4), (2, 3), (5, 3)]), ids([(0, 4), (1, 3), (2, 3)])
    if bits is not None:
        with pytest.raises(NotImplementedError, match="segment_ids .* with a quantized KV cache"):
            model.prefill(toks[:, :7], 14, segment_ids=returning[:, :7])
        return
    forward = nnx.jit(lambda m, t, s: m(t, segment_ids=s))
    assert rel_err(forward(model, toks[:, :10], returning), forward(model, toks[:, :10], numbered)) < 1e-6
    with pytest.raises(ValueError, match="segment_ids must keep each document contiguous"):
        model(toks[:, :10], segment_ids=returning)

    def decoded(prompt_ids, step_ids):
        logits, caches = model.prefill(toks[:, :7], 14, segment_ids=prompt_ids)
        pieces = [logits]
        for t, i in zip(range(7, 14), step_ids):
            logits, caches = model.decode_step(toks[:, t : t + 1], caches, segment_ids=jnp.full((2, 1), i, jnp.int32))
            pieces.append(logits)
        return jnp.concatenate(pieces, axis=1)

    got = decoded(returning[:, :7], [5, 5, 5, 2, 2, 5, 5])  # back to 5, then to 2, then to 5
    assert rel_err(got, decoded(numbered[:, :7], [2, 2, 2, 3, 3, 4, 4])) < 1e-6


@pytest.mark.parametrize("pattern", ["PAWDGM", *(pytest.param(p, marks=pytest.mark.slow) for p in "PAWDGM")])
def test_a_non_finite_input_is_nan_in_its_document_in_every_layer_kind(pattern):
    """The non-finite contract inside an LM: a NaN or inf embedding row, fed at a token of the first document
    (prefilled) and of the second (decoded) of a packed row, gives NaN in every logit from that token to its
    document's end, in the full forward and in a prefill then decode steps (the third document started by a new
    id in a step), never zeros or anything finite; every other row equals the clean model's (a later document
    never meets an earlier one's bad keys and values in a cache). The quick case runs every mixer kind (P, A, W, D,
    G, M) one after another; each letter alone is a further case."""
    config = dataclasses.replace(
        TINY, pattern=pattern, n_layers=max(2, len(pattern)), conv_size=4, qk_norm=True, tie_embeddings=False
    )
    model = LM(dataclasses.replace(config, ssm_state_size=8), rngs=nnx.Rngs(15))
    toks = 1 + tokens(16, 1, 24, config.vocab_size - 1)  # ids 1..49: only the two set here are the bad id 0
    toks = toks.at[0, 4].set(0).at[0, 14].set(0)
    seg = jnp.asarray([[0] * 10 + [1] * 8 + [2] * 6], jnp.int32)
    t = jnp.arange(24)
    sees_it = ((t >= 4) & (t < 10)) | ((t >= 14) & (t < 18))
    forward = nnx.jit(lambda m, t, s: m(t, segment_ids=s))
    clean = forward(model, toks, seg)
    assert bool(jnp.all(jnp.isfinite(clean)))
    for bad in (jnp.nan, jnp.inf):
        model.embed.embedding[...] = model.embed.embedding[...].at[0].set(bad)
        logits, caches = model.prefill(toks[:, :12], 24, segment_ids=seg[:, :12], step_tokens=3)
        pieces = [logits]
        for start in range(12, 24, 3):
            step = slice(start, start + 3)
            logits, caches = model.decode_step(toks[:, step], caches, segment_ids=seg[:, step])
            pieces.append(logits)
        for got in (forward(model, toks, seg), jnp.concatenate(pieces, axis=1)):
            assert bool(jnp.all(jnp.isnan(got[0, sees_it]))), (pattern, bad)
            assert rel_err(got[0, ~sees_it], clean[0, ~sees_it]) < 1e-5, (pattern, bad)
