"""Prefix snapshots: a prefilled LM cache as a value (a pytree, snapshot_value.py), to continue, fork, save and load.

A `Snapshot` holds the LM's LMCache (each layer's cache: a P layer's fixed-size state, an A or W layer's keys and
values, float or quantized; the tokens seen; each row's segment id and next RoPE position), the last token's
logits (the first new token's distribution) and, as static fields, the model config it came from, a digest of the
model's weights, max_len and step_tokens (the caches' shapes). `prefill` makes one; `extend` runs more tokens into
it; `generate(model, suffix, n, start=snapshot)` continues from it; `fork` copies a one-row snapshot to n rows;
`resize` moves its caches into those of another max_len and step_tokens (a KV cache's tokens into other slots);
`save_snapshot` / `load_snapshot` write and read one safetensors file (of FORMAT, mode 0644; its folder made when
missing) with a checksum pair per array, its recurrent states float32 or quantized per row (`save_snapshot(...,
state_format=8 | 4 | "fp8")`: quantized_state.py; fp8 values are stored as their bytes, uint8, since the file's flax
reader has no float8 type). Every path that continues a snapshot checks its config, that its states are float32
and that its weights digest is the model's (`check_snapshot`; the digest computed once per set of weights).

Files are safetensors, not Orbax: a snapshot is a few arrays written and read whole, which safetensors keeps in one
file with a JSON header (the config, shapes and checksums); Orbax writes a folder of several files through its
asynchronous machinery, built for sharded train states.
"""

import dataclasses
import hashlib
import json
import os
import weakref

import jax
import jax.numpy as jnp
import safetensors
import safetensors.flax
from flax import nnx
from jaxtyping import Array

from retention.checksum import mismatched, tree_checksums
from retention.nn import LM, LMCache, LMConfig
from retention.ops.attention.decode import KVCache, move_slots
from retention.ops.attention.quantized import QuantizedKVCache
from retention.serve.cache_limits import check_room, growing_layers, step_size
from retention.serve.prompts import check_prompt, check_prompt_ids, prompt_segments
from retention.serve.quantized_state import STATE_FORMATS, quantize_states, state_format_of
from retention.serve.snapshot_value import Snapshot
from retention.validation import check_int, concrete

# config fields that choose an op path, not the caches' layout or the function computed
OP_PATH_FIELDS = ("retention_impl", "attention_impl")
FORMAT = "retention.snapshot/1"


# model -> (weak references to the parameter arrays its digest was computed from, the digest)
_DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def weights_digest(model: LM, state: nnx.State | None = None) -> str:
    """sha256 of the checksum pair of every parameter array (retention/checksum.py), computed on the device
    once per set of arrays: it is kept per model beside weak references to the arrays it was computed from, and
    reused while the model holds those very arrays. JAX arrays are immutable, so any change of weights in place
    (nnx.update, an optimizer step, assigning a Variable's value) puts other arrays in the model and the digest is
    computed again; a model holding other (mutable) arrays is hashed every time. `state`: the model's nnx.state
    (or nnx.split's) when the caller holds it, which saves walking the model's graph again."""
    params = nnx.state(model, nnx.Param) if state is None else nnx.filter_state(state, nnx.Param)
    leaves = jax.tree.leaves(params)
    known = _DIGESTS.get(model)
    if known is not None and len(known[0]) == len(leaves) and all(r() is x for r, x in zip(known[0], leaves)):
        return known[1]
    sums, _ = tree_checksums(params)
    digest = hashlib.sha256(json.dumps(sums, sort_keys=True).encode()).hexdigest()
    if all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) for x in leaves):
        _DIGESTS[model] = (tuple(weakref.ref(x) for x in leaves), digest)
    return digest


def _config_difference(saved: LMConfig, model: LMConfig) -> str | None:
    """The fields (op paths aside) where the snapshot's config differs from the model's, or None."""
    a, b = dataclasses.asdict(saved), dataclasses.asdict(model)
    diff = [f"{k}={a[k]!r} (snapshot) vs {b[k]!r} (model)" for k in a if k not in OP_PATH_FIELDS and a[k] != b.get(k)]
    return ", ".join(diff) or None


def _check_float_states(snapshot: Snapshot, name: str) -> None:
    """`snapshot` (the argument `name`) holds its recurrent states in float32, not quantized (ValueError)."""
    if (state_format := state_format_of(snapshot)) is not None:
        raise ValueError(
            f"{name}'s recurrent states are quantized ({state_format!r}): call dequantize_states({name}) "
            "(retention.serve) to continue from it"
        )


def check_snapshot(model: LM, snapshot, name: str = "start", state: nnx.State | None = None) -> None:
    """`snapshot` (the argument `name`) is a Snapshot, its states in float32, prefilled by a model of `model`'s
    config and weights (TypeError; ValueError naming the differing fields, the quantized states or the weights).
    The weights' digest is computed once per set of parameter arrays (`weights_digest`, given `state`)."""
    if not isinstance(snapshot, Snapshot):
        raise TypeError(f"{name} must be a Snapshot (see retention.prefill), got {type(snapshot).__name__}")
    if difference := _config_difference(snapshot.config, model.config):
        raise ValueError(f"{name} comes from another model config: {difference}")
    _check_float_states(snapshot, name)
    if snapshot.weights_digest != weights_digest(model, state):
        raise ValueError(
            f"{name} was prefilled by a model with other weights (its weights digest differs from this model's)"
        )


def prefill(
    model: LM,
    tokens_BT,
    *,
    max_len: int,
    prompt_lengths=None,
    step_tokens: int = 1,
) -> Snapshot:
    """Run a prompt into fresh caches: the Snapshot to continue from.

    ```python
    snap = retention.prefill(model, prefix_1T, max_len=T + 512)
    out = retention.generate(model, question_1n, 64, temperature=0.0, start=snap)
    ```

    Args:
        model: the LM.
        tokens_BT (Array): the prompt, int [B, T].
        max_len: the caches hold up to this many tokens in all.
        prompt_lengths (Array | None): int [B]: ragged prompts, left-padded, as in `generate` (row b's prompt is its
            last prompt_lengths[b] tokens; each row continues as its prompt alone).
        step_tokens: later steps feed up to this many tokens.

    Returns:
        The snapshot.
    """
    return prefill_logits(model, tokens_BT, max_len=max_len, prompt_lengths=prompt_lengths, step_tokens=step_tokens)[0]


def prefill_logits(
    model: LM,
    tokens_BT,
    *,
    max_len: int,
    prompt_lengths=None,
    step_tokens: int = 1,
) -> tuple[Snapshot, Array]:
    """`prefill` (the same arguments, checked the same way), also returning every prompt token's logits [B, T, V],
    from which a prefix cache cuts its entries at block boundaries.

    Returns:
        (the snapshot, the logits [B, T, V]).
    """
    check_prompt("tokens", tokens_BT)
    check_int("max_len", max_len)
    check_int("step_tokens", step_tokens)
    segment_ids = None if prompt_lengths is None else prompt_segments(prompt_lengths, *tokens_BT.shape)
    check_prompt_ids(tokens_BT, segment_ids, model.config.vocab_size)
    tokens_BT = jnp.asarray(tokens_BT, jnp.int32)
    if segment_ids is not None:
        tokens_BT = jnp.where(segment_ids == 1, tokens_BT, 0)  # the padding's values are never seen
    logits_BTV, caches = model.prefill(tokens_BT, max_len, segment_ids=segment_ids, step_tokens=step_tokens)
    return Snapshot(caches, logits_BTV[:, -1], model.config, weights_digest(model), max_len, step_tokens), logits_BTV


def extend(model: LM, snapshot: Snapshot, tokens_Bn) -> Snapshot:
    """The snapshot after n more tokens, continuing each row's document.

    The tokens are fed in steps of up to snapshot.step_tokens tokens when a layer's cache bounds a decode step (a
    sliding window's ring buffer holds that many: `MixerKind.step_bounded`), in one step otherwise.

    Args:
        model: the snapshot's LM.
        snapshot: the snapshot to continue.
        tokens_Bn (Array): the new tokens, int [B, n].

    Returns:
        The new snapshot; n = 0 returns `snapshot`.
    """
    check_snapshot(model, snapshot, "snapshot")
    return extend_checked(model, snapshot, tokens_Bn)


def extend_checked(model: LM, snapshot: Snapshot, tokens_Bn) -> Snapshot:
    """`extend` of a snapshot `check_snapshot` has passed for `model` (`generate` checks it as its start)."""
    return extend_logits(model, snapshot, tokens_Bn)[0]


def extend_logits(model: LM, snapshot: Snapshot, tokens_Bn) -> tuple[Snapshot, Array]:
    """`extend_checked`, and the logits of its last step's tokens [B, m, V]: all n new tokens' when they run as one
    step (m = n), the last piece's when a ring buffer bounds the step, the snapshot's own (m = 1) when n = 0.

    Args:
        model: the snapshot's LM.
        snapshot: a snapshot `check_snapshot` has passed for `model`.
        tokens_Bn (Array): the new tokens, int [B, n].

    Returns:
        (the new snapshot, the logits [B, m, V]).
    """
    if getattr(tokens_Bn, "ndim", None) != 2 or tokens_Bn.shape[0] != snapshot.rows:
        raise ValueError(f"tokens must be an int array [B={snapshot.rows}, n], got {getattr(tokens_Bn, 'shape', None)}")
    n = tokens_Bn.shape[1]
    length = concrete(snapshot.caches.length)
    check_room(model.config, None if length is None else int(length), n, snapshot.max_len, f"{n} more tokens")
    if n == 0:
        return snapshot, snapshot.logits[:, None]
    piece = step_size(model.config, snapshot.step_tokens, n)
    caches = snapshot.caches
    for start in range(0, n, piece):
        logits_BmV, caches = model.decode_step(jnp.asarray(tokens_Bn[:, start : start + piece], jnp.int32), caches)
    return dataclasses.replace(snapshot, caches=caches, logits=logits_BmV[:, -1]), logits_BmV


def snapshot_bytes(snapshot: Snapshot) -> int:
    """Bytes of the snapshot's arrays (caches and logits): for P layers the same at any prompt length.

    Args:
        snapshot: the snapshot.

    Returns:
        The bytes.
    """
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(snapshot))


def resize(model: LM, snapshot: Snapshot, *, max_len: int, step_tokens: int = 1) -> Snapshot:
    """The snapshot with caches made for another max_len and step_tokens, continuing to the same tokens: each A or
    W layer's keys and values moved into the new slots (`move_slots`: a full-attention cache's tokens kept in
    place, a window's ring buffer re-laid for its new size), every fixed-size cache (P, D, G, M states, the
    convolutions' inputs) and the bookkeeping kept as they are.

    ```python
    snap = retention.prefill(model, prefix_1T, max_len=T)  # as small as the prefix
    snap = retention.serve.resize(model, snap, max_len=T + 512)  # room for 512 more tokens
    ```

    Args:
        model: the snapshot's LM.
        snapshot: the snapshot, float32 states.
        max_len: the new caches hold up to this many tokens in all.
        step_tokens: and are decoded in steps of up to this many tokens.

    Returns:
        The resized snapshot (`snapshot` itself when its shapes are those asked for).

    Raises:
        ValueError: the snapshot comes from another model (`check_snapshot`), or holds more tokens than max_len
            while a layer's cache keeps every token.
    """
    check_snapshot(model, snapshot, "snapshot")
    check_int("max_len", max_len)
    check_int("step_tokens", step_tokens)
    held, growing = int(snapshot.caches.length), growing_layers(model.config)
    if growing and held > max_len:
        raise ValueError(
            f"snapshot holds {held} tokens, more than max_len={max_len}, and the {growing} layers' caches keep every "
            "token (resize to a max_len of at least the tokens held)"
        )
    if (snapshot.max_len, snapshot.step_tokens) == (max_len, step_tokens):
        return snapshot
    empty = model.init_caches(snapshot.rows, max_len, step_tokens=step_tokens)
    caches = _moved_caches(snapshot.caches, empty)
    return dataclasses.replace(snapshot, caches=caches, max_len=max_len, step_tokens=step_tokens)


def is_kv_cache(x) -> bool:
    """Whether x is a KV cache (a KVCache or QuantizedKVCache: the leaf of a tree.map over an LMCache's keys and
    values).

    Args:
        x: a node of an LMCache.

    Returns:
        True for a KVCache or QuantizedKVCache.
    """
    return isinstance(x, (KVCache, QuantizedKVCache))


@jax.jit
def _moved_caches(caches: LMCache, empty: LMCache) -> LMCache:
    """`caches` in the shapes of `empty` (caches of the same LM): each KV cache's tokens moved into empty's slots
    (over the leading repeats axis of stacked layers too), every other array kept."""

    def move(old, new):
        if not is_kv_cache(old):
            return old
        moved = move_slots
        for _ in range(old.pos.ndim - 1):  # stacked layers (scan_layers): one cache per repeat
            moved = jax.vmap(moved)
        return moved(old, new)

    return jax.tree.map(move, caches, empty, is_leaf=is_kv_cache)


def _abstract_caches(config: LMConfig, batch: int, max_len: int, step_tokens: int) -> LMCache:
    """The shapes and dtypes of `LM(config).init_caches(batch, max_len, step_tokens=...)`, built without weights."""
    model = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
    return jax.eval_shape(lambda: model.init_caches(batch, max_len, step_tokens=step_tokens))


def fork(snapshot: Snapshot, n: int) -> Snapshot:
    """A one-row snapshot copied to n rows (the batch axis of every per-row array broadcast), so n continuations of
    one prefix run as one batch.

    Args:
        snapshot: a one-row snapshot.
        n: the rows.

    Returns:
        The n-row snapshot.
    """
    if not isinstance(snapshot, Snapshot):
        raise TypeError(f"snapshot must be a Snapshot (see retention.prefill), got {type(snapshot).__name__}")
    check_int("n", n)
    _check_float_states(snapshot, "snapshot")
    if snapshot.rows != 1:
        raise ValueError(f"fork needs a one-row snapshot, got {snapshot.rows} rows")
    one = _abstract_caches(snapshot.config, 1, snapshot.max_len, snapshot.step_tokens)
    many = _abstract_caches(snapshot.config, n, snapshot.max_len, snapshot.step_tokens)
    grow = lambda x, a, b: jnp.broadcast_to(x, b.shape) if a.shape != b.shape else x
    caches = jax.tree.map(grow, snapshot.caches, one, many)
    logits = jnp.broadcast_to(snapshot.logits, (n,) + snapshot.logits.shape[1:])
    return dataclasses.replace(snapshot, caches=caches, logits=logits)


def _stored(x: Array) -> Array:
    """An array as the file holds it: float8 as its bytes (uint8)."""
    return jax.lax.bitcast_convert_type(x, jnp.uint8) if x.dtype == jnp.float8_e4m3fn else x


def _tensors(snapshot: Snapshot) -> dict[str, Array]:
    return {jax.tree_util.keystr(p): _stored(x) for p, x in jax.tree_util.tree_leaves_with_path(snapshot)}


def save_snapshot(path: str | os.PathLike, snapshot: Snapshot, *, state_format=None) -> None:
    """Write the snapshot to one safetensors file: its arrays, and in the header its config, weights digest,
    shapes, the format of its recurrent states and the checksum pair of every array. `load_snapshot` gives back what
    was written.

    Args:
        path: the file.
        snapshot: the snapshot.
        state_format (int | str | None): 8, 4 or "fp8": quantize the float32 states per row first
            (`quantize_states`); None writes them as they are (float32, or quantized already).
    """
    if not isinstance(snapshot, Snapshot):
        raise TypeError(f"snapshot must be a Snapshot (see retention.prefill), got {type(snapshot).__name__}")
    if state_format is not None:
        snapshot = quantize_states(snapshot, state_format)
    checksums, _ = tree_checksums(snapshot)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    header = {
        "format": FORMAT,
        "config": dataclasses.asdict(snapshot.config),
        "weights_digest": snapshot.weights_digest,
        "rows": snapshot.rows,
        "max_len": snapshot.max_len,
        "step_tokens": snapshot.step_tokens,
        "state_format": state_format_of(snapshot),
        "checksums": checksums,
    }
    safetensors.flax.save_file(_tensors(snapshot), path, metadata={"snapshot": json.dumps(header)})
    os.chmod(path, 0o644)  # readable by others, as the folder is (safetensors writes its files private)


def load_snapshot(path: str | os.PathLike, model: LM) -> Snapshot:
    """The snapshot saved at `path`, for `model`; its states quantized when they were saved so
    (`dequantize_states` to continue).

    Args:
        path: the file `save_snapshot` wrote.
        model: the LM it was made with.

    Returns:
        The snapshot.

    Raises:
        ValueError: naming the file when it cannot be read, is of another format than FORMAT or an array fails its
            checksum, and naming the differing fields when it comes from another config (or other weights).
    """
    path = os.fspath(path)
    damaged = lambda e: ValueError(f"snapshot file {path} is damaged or not a snapshot: {type(e).__name__}: {e}")
    try:
        with safetensors.safe_open(path, framework="flax") as f:
            header = json.loads(f.metadata()["snapshot"])
        kind = header["format"]
    except Exception as e:  # a damaged file raises whatever its reader hits
        raise damaged(e) from e
    if kind != FORMAT:
        raise ValueError(f"snapshot file {path} is of format {kind!r}: this version reads {FORMAT!r} only")
    try:
        tensors = safetensors.flax.load_file(path)
        config = LMConfig.from_record(header["config"])
    except Exception as e:
        raise damaged(e) from e
    if difference := _config_difference(config, model.config):
        raise ValueError(f"snapshot file {path} comes from another model config: {difference}")
    state_format = header.get("state_format")
    if state_format is not None and state_format not in STATE_FORMATS:
        raise ValueError(f"snapshot file {path} is damaged: unknown state_format {state_format!r}")
    if header["weights_digest"] != weights_digest(model):
        raise ValueError(f"snapshot file {path} comes from a model with other weights (its weights digest differs)")
    abstract = Snapshot(
        _abstract_caches(config, header["rows"], header["max_len"], header["step_tokens"]),
        jax.ShapeDtypeStruct((header["rows"], config.vocab_size), jnp.float32),
        model.config,
        header["weights_digest"],
        header["max_len"],
        header["step_tokens"],
    )
    if state_format is not None:
        abstract = jax.eval_shape(lambda s: quantize_states(s, state_format), abstract)
    paths, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    keys = [jax.tree_util.keystr(p) for p, _ in paths]
    stored = lambda a: jax.eval_shape(_stored, a)
    fits = lambda k, a: k in tensors and (tensors[k].shape, tensors[k].dtype) == (stored(a).shape, stored(a).dtype)
    wrong = [k for k, (_, a) in zip(keys, paths) if not fits(k, a)]
    if wrong or len(tensors) != len(keys):
        raise ValueError(f"snapshot file {path} is damaged: its arrays do not match the snapshot's ({wrong[:1]})")
    read = lambda k, a: jax.lax.bitcast_convert_type(tensors[k], a.dtype) if a.dtype != tensors[k].dtype else tensors[k]
    snapshot = jax.tree_util.tree_unflatten(treedef, [read(k, a) for k, (_, a) in zip(keys, paths)])
    bad, _ = mismatched(header["checksums"], snapshot)
    if bad:
        raise ValueError(f"snapshot file {path} is damaged: {len(bad)} arrays differ from their checksums ({bad[0]})")
    return snapshot
