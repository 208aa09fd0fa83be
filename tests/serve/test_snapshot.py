"""Prefix snapshots: generation from a snapshot equals generation from the full prompt (greedy token for token, sampled
with the same key) for P, A, W and a hybrid with a convolution; forked rows equal separate runs; a saved snapshot
(quantized KV caches included) loads back bit-identical, into a folder it makes, a file others read (0644); a damaged
file, a file of an unknown format, another config and other weights are refused, naming them, and a snapshot of other
weights is refused in memory too, on every path that continues one. Quantized KV caches are not in the equality test: a
full-prompt prefill attends the prompt's keys in float, a snapshot's suffix attends them quantized, so the two agree to
the quantization error."""

import dataclasses
import json
import stat

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import safetensors.numpy
from flax import nnx

import retention
from retention import fork, generate, load_snapshot, prefill, save_snapshot, snapshot_bytes
from retention.nn import LM, LMConfig, decode_cache_bytes
from retention.serve import Engine, extend, verify

pytestmark = pytest.mark.integration  # the serving layer (retention.serve, snapshots): make test-integration

BASE = LMConfig(vocab_size=61, d_model=32, n_layers=2, pattern="P", n_heads=4, n_kv_heads=2, head_dim=8, window=5)
CONFIGS = {
    "P": dict(pattern="P", chunk_size=16),
    "A": dict(pattern="A"),
    "W": dict(pattern="W"),
    "PA conv4": dict(pattern="PA", conv_size=4, chunk_size=16),
    "A int8": dict(pattern="A", kv_cache_bits=8),
    "PW int4": dict(pattern="PW", kv_cache_bits=4),
}
PREFIX, SUFFIX, NEW = 11, 6, 9


def model_of(name: str, seed: int = 0) -> LM:
    return LM(dataclasses.replace(BASE, **CONFIGS[name]), rngs=nnx.Rngs(seed))


def tokens(seed: int, B: int, T: int) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (B, T), 0, BASE.vocab_size, dtype=jnp.int32)


def assert_bitwise_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


@pytest.mark.parametrize("name", [*(pytest.param(n, marks=pytest.mark.slow) for n in ("P", "A", "W")), "PA conv4"])
def test_generation_from_a_snapshot_equals_the_full_prompt(name):
    model = model_of(name)
    prefix, suffix = tokens(1, 2, PREFIX), tokens(2, 2, SUFFIX)
    snapshot = prefill(model, prefix, max_len=PREFIX + SUFFIX + NEW, step_tokens=4)  # W: the suffix in 2 pieces
    want = generate(model, jnp.concatenate([prefix, suffix], axis=1), NEW, temperature=0.0)
    got = generate(model, suffix, NEW, temperature=0.0, start=snapshot)
    assert got.tokens.shape == (2, SUFFIX + NEW)
    np.testing.assert_array_equal(got.tokens, want.tokens[:, PREFIX:])
    np.testing.assert_array_equal(got.lengths, want.lengths - PREFIX)
    assert len(set(np.asarray(want.tokens[:, -NEW:]).ravel().tolist())) > 2  # the oracle is not a constant


def test_sampled_and_empty_suffix_generation_from_a_snapshot():
    model = model_of("PA conv4")
    prefix, suffix = tokens(1, 2, PREFIX), tokens(2, 2, SUFFIX)
    snapshot = prefill(model, prefix, max_len=PREFIX + SUFFIX + NEW)
    key = jax.random.key(7)
    want = generate(model, jnp.concatenate([prefix, suffix], axis=1), NEW, temperature=1.3, top_k=20, key=key)
    got = generate(model, suffix, NEW, temperature=1.3, top_k=20, key=key, start=snapshot)
    np.testing.assert_array_equal(got.tokens, want.tokens[:, PREFIX:])
    # an empty suffix: the first new token comes from the snapshot's last logits
    alone = generate(model, prefix, NEW, temperature=1.3, top_k=20, key=key)
    from_prefix = generate(model, suffix[:, :0], NEW, temperature=1.3, top_k=20, key=key, start=snapshot)
    np.testing.assert_array_equal(from_prefix.tokens, alone.tokens[:, PREFIX:])


def test_ragged_prefixes_continue_as_each_row_alone():
    model = model_of("PA conv4")
    prefix, suffix, lengths = tokens(3, 2, PREFIX), tokens(4, 2, SUFFIX), jnp.array([PREFIX, 5])
    snapshot = prefill(model, prefix, max_len=PREFIX + SUFFIX + NEW, prompt_lengths=lengths)
    got = generate(model, suffix, NEW, temperature=0.0, start=snapshot)
    for row, T in enumerate(lengths.tolist()):
        alone = jnp.concatenate([prefix[row : row + 1, PREFIX - T :], suffix[row : row + 1]], axis=1)
        want = generate(model, alone, NEW, temperature=0.0)
        np.testing.assert_array_equal(got.tokens[row], want.tokens[0, T:])


@pytest.mark.parametrize("name", [*(pytest.param(n, marks=pytest.mark.slow) for n in ("P", "W")), "PA conv4"])
def test_forked_rows_equal_separate_runs(name):
    model = model_of(name)
    prefix, suffixes = tokens(5, 1, PREFIX), tokens(6, 3, SUFFIX)
    forked = fork(prefill(model, prefix, max_len=PREFIX + SUFFIX + NEW, step_tokens=SUFFIX), 3)
    assert forked.rows == 3
    got = generate(model, suffixes, NEW, temperature=0.0, start=forked)
    for row in range(3):
        full = jnp.concatenate([prefix, suffixes[row : row + 1]], axis=1)
        np.testing.assert_array_equal(got.tokens[row], generate(model, full, NEW, temperature=0.0).tokens[0, PREFIX:])
    with pytest.raises(ValueError, match="one-row snapshot, got 3 rows"):
        fork(forked, 2)


def test_snapshot_bytes_are_the_caches_and_logits():
    for name, fixed in (("P", True), ("A", False), ("PA conv4", False), ("A int8", False)):
        model = model_of(name)
        sizes = []
        for max_len in (16, 64):
            snapshot = prefill(model, tokens(7, 2, 9), max_len=max_len)
            want = decode_cache_bytes(model.config, 2, max_len) + 4 * 2 * BASE.vocab_size
            assert snapshot_bytes(snapshot) == want
            sizes.append(want)
        assert (sizes[0] == sizes[1]) == fixed, name


@pytest.mark.parametrize("name", [pytest.param("PA conv4", marks=pytest.mark.slow), "PW int4"])
def test_save_and_load_is_bit_identical(name, tmp_path):
    model = model_of(name)
    snapshot = prefill(model, tokens(8, 2, PREFIX), max_len=PREFIX + SUFFIX + NEW, step_tokens=3)
    path = tmp_path / "prefix.safetensors"
    save_snapshot(path, snapshot)
    loaded = load_snapshot(path, model)
    assert isinstance(loaded, retention.Snapshot)
    assert (loaded.max_len, loaded.step_tokens, loaded.config) == (snapshot.max_len, 3, snapshot.config)
    assert_bitwise_equal(loaded, snapshot)
    suffix = tokens(9, 2, SUFFIX)
    want = generate(model, suffix, NEW, temperature=0.0, start=snapshot)
    np.testing.assert_array_equal(generate(model, suffix, NEW, temperature=0.0, start=loaded).tokens, want.tokens)


def test_a_damaged_file_is_refused_naming_it(tmp_path):
    model = model_of("PA conv4")
    path = tmp_path / "prefix.safetensors"
    save_snapshot(path, prefill(model, tokens(10, 1, PREFIX), max_len=32))
    data = bytearray(path.read_bytes())
    header_end = 8 + int.from_bytes(data[:8], "little")
    for where, message in ((header_end + (len(data) - header_end) // 2, "differ from their checksums"), (20, "")):
        damaged = data.copy()
        damaged[where] ^= 0x10
        bad = tmp_path / f"damaged_{where}.safetensors"
        bad.write_bytes(bytes(damaged))
        with pytest.raises(ValueError, match=rf"snapshot file {bad}.*damaged.*{message}"):
            load_snapshot(bad, model)


def test_another_config_or_other_weights_are_refused(tmp_path):
    model = model_of("PA conv4")
    snapshot = prefill(model, tokens(11, 1, PREFIX), max_len=32)
    path = tmp_path / "prefix.safetensors"
    save_snapshot(path, snapshot)
    other = LM(dataclasses.replace(model.config, conv_size=3), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"another model config: conv_size=4 \(snapshot\) vs 3 \(model\)"):
        load_snapshot(path, other)
    with pytest.raises(ValueError, match=r"start comes from another model config: conv_size=4"):
        generate(other, tokens(12, 1, 2), 3, temperature=0.0, start=snapshot)
    with pytest.raises(ValueError, match="other weights"):
        load_snapshot(path, model_of("PA conv4", seed=1))
    with pytest.raises(TypeError, match="start must be a Snapshot"):
        generate(model, tokens(12, 1, 2), 3, temperature=0.0, start=snapshot.caches)
    with pytest.raises(ValueError, match="no room for max_new_tokens=30"):
        generate(model, tokens(12, 1, 2), 30, temperature=0.0, start=snapshot)


def test_a_snapshot_of_other_weights_is_refused_on_every_path():
    """A snapshot prefilled by another model of the same config is refused wherever a model continues it
    (generate, extend, a fork, the engine, verify), and so is one whose model's weights changed in place since."""
    a, b = model_of("PA conv4", seed=0), model_of("PA conv4", seed=1)
    prefix, suffix = tokens(13, 1, PREFIX), tokens(14, 1, 2)
    snapshot = prefill(a, prefix, max_len=32, step_tokens=4)
    message = r"start was prefilled by a model with other weights \(its weights digest differs from this model's\)"
    with pytest.raises(ValueError, match=message):
        generate(b, suffix, 3, temperature=0.0, start=snapshot)
    with pytest.raises(ValueError, match=message):
        generate(b, suffix.repeat(2, axis=0), 3, temperature=0.0, start=fork(snapshot, 2))
    with pytest.raises(ValueError, match=message.replace("start", "snapshot")):
        extend(b, snapshot, suffix)
    with pytest.raises(ValueError, match=message.replace("start", "snapshot")):
        verify(b, snapshot, suffix)
    with pytest.raises(ValueError, match=message):
        Engine(b, slots=1, max_len=32, step_tokens=4).submit(snapshot, max_new_tokens=2)
    generate(a, suffix, 3, temperature=0.0, start=snapshot)  # its own model continues it
    nnx.update(a, nnx.state(b, nnx.Param))  # a's weights, changed in place
    with pytest.raises(ValueError, match=message):
        generate(a, suffix, 3, temperature=0.0, start=snapshot)
    again = prefill(a, prefix, max_len=32, step_tokens=4)  # a holds b's weights now: b continues it
    full = generate(b, jnp.concatenate([prefix, suffix], axis=1), 3, temperature=0.0)
    np.testing.assert_array_equal(generate(b, suffix, 3, temperature=0.0, start=again).tokens, full.tokens[:, PREFIX:])


def test_an_unknown_file_format_is_refused_naming_it(tmp_path):
    model = model_of("PA conv4")
    path = tmp_path / "prefix.safetensors"
    save_snapshot(path, prefill(model, tokens(15, 1, PREFIX), max_len=32))
    with safetensors.safe_open(str(path), framework="numpy") as f:
        header = json.loads(f.metadata()["snapshot"])
        arrays = {name: f.get_tensor(name) for name in f.keys()}
    other = tmp_path / "other.safetensors"
    header["format"] = "retention.snapshot/2"
    safetensors.numpy.save_file(arrays, str(other), metadata={"snapshot": json.dumps(header)})
    with pytest.raises(ValueError, match=rf"snapshot file {other} is of format 'retention.snapshot/2'.*snapshot/1"):
        load_snapshot(other, model)


def test_save_snapshot_makes_its_folder_and_a_file_others_read(tmp_path):
    model = model_of("PA conv4")
    snapshot = prefill(model, tokens(16, 1, PREFIX), max_len=32)
    path = tmp_path / "new" / "folder" / "prefix.safetensors"
    save_snapshot(path, snapshot)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # safetensors alone writes 0600
    assert_bitwise_equal(load_snapshot(path, model), snapshot)
