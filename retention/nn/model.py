"""The language model: token embedding, pre-norm blocks (RMSNorm, mixer, RMSNorm, SwiGLU MLP; mlp_width 0: no MLP),
final norm, head.

`config.pattern` is a string over the mixer registry's letters (registry.py: P power retention, A full attention,
W sliding-window attention); layer i gets pattern[i % len(pattern)], with n_layers >= len(pattern) so that every
letter gets a layer.
`LM.prefill` runs a prompt into fresh per-layer caches (each mixer's `prefill`: the attention layers run their
full-sequence op and store the keys and values, the fixed-state layers run their step op from an empty state);
`LM.decode_step` continues from them, compiled once per shape (positions come from the caches, traced), so
prefill-then-decode gives the logits of one full forward.
Packed documents: `segment_ids` [B, T] (every entry point takes them) keep documents apart in every mixer, and
RoPE positions restart at 0 at each document (`layers.document_positions`); LMCache records each row's last
segment id and next position, so a decode step continues a document (segment_ids None, or the same id) or starts
one (a new id), and prefill of a packed prompt then decode equals the documents run one by one.
`config.scan_layers` stacks the blocks by the pattern's period and runs them with `nnx.scan` (scan.py; the caches
are stacked the same way); `config.remat_policy` runs each block under `nnx.remat` (remat.py), scanned or not.
"""

import dataclasses
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from retention.nn.config import LMConfig
from retention.nn.layers import SwiGLU, document_positions
from retention.nn.mixer_interface import MODES, check_mode
from retention.nn.registry import MIXERS
from retention.nn.remat import block_runner, checkpoint_policy
from retention.nn.scan import run_scanned, scan_state, stacked_caches, stacked_periods, unscan_state
from retention.nn.sizing import flops_per_token
from retention.ops.validation import check_segment_ids
from retention.parallel.rules import BTD, BTV, constrain, logical_param
from retention.validation import check_at_runtime, check_int, concrete


class LMCache(NamedTuple):
    """The caches a decode step continues from: `LM.init_caches`, `LM.prefill`, `LM.decode_step`.

    Attributes:
        layers: each layer's mixer cache (RetentionCache for P, AttentionCache for A and W, MatrixStateCache for D, G
            and M); with scan_layers, one per letter of the period with a leading axis over the repeats.
        length: the tokens seen so far, a scalar.
        segment_id: per row, the segment id of the last token [B].
        position: per row, the RoPE position of the next token [B].
    """

    layers: tuple
    length: Int[Array, ""]
    segment_id: Int[Array, " B"]
    position: Int[Array, " B"]


class Block(nnx.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x)) (no MLP, and no second norm, when config.mlp_hidden is 0)."""

    def __init__(self, config: LMConfig, kind: str, *, rngs: nnx.Rngs):
        dtype, param_dtype = jnp.dtype(config.dtype), jnp.dtype(config.param_dtype)
        norm = lambda: nnx.RMSNorm(
            config.d_model,
            epsilon=config.norm_eps,
            scale_metadata=logical_param("embed"),
            dtype=dtype,
            param_dtype=param_dtype,
            rngs=rngs,
        )
        self.mixer_norm = norm()
        self.mixer = MIXERS[kind].build(config.for_kind(kind), rngs=rngs)
        self.mlp_norm = norm() if config.mlp_hidden else None
        self.mlp = (
            SwiGLU(config.d_model, config.mlp_hidden, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
            if config.mlp_hidden
            else None
        )

    def __call__(self, x_BTD, *, positions, segment_ids=None, cache=None, mode: str = "forward"):
        """Returns (x [B, T, D], the mixer's new cache): the mixer's method of `mode` (one of `MODES`: "forward" its
        `__call__`, cache None and None back; "prefill", "decode" or "verify" from `cache`, the verify step's
        per-token caches back)."""
        h = self.mixer_norm(x_BTD)
        with jax.named_scope(type(self.mixer).__name__):
            if mode == "forward":
                h = self.mixer(h, positions=positions, segment_ids=segment_ids)
            else:
                run = getattr(self.mixer, check_mode(mode))
                h, cache = run(h, positions=positions, segment_ids=segment_ids, cache=cache)
        x_BTD = x_BTD + h
        if self.mlp is not None:
            x_BTD = x_BTD + self.mlp(self.mlp_norm(x_BTD))
        return constrain(x_BTD, BTD), cache


class LM(nnx.Module):
    """Decoder-only language model over `config.layer_kinds`: token embedding, pre-norm blocks (RMSNorm, mixer,
    RMSNorm, SwiGLU MLP), final norm, head.

    ```python
    model = LM(LMConfig(pattern="PPPA", n_layers=4), rngs=nnx.Rngs(0))
    logits = model(tokens)  # [B, T, vocab_size] float32
    ```

    Args:
        config: the hyperparameters.
        rngs: the parameters' initialisation.

    Raises:
        TypeError: `config` is not an LMConfig.
    """

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, LMConfig):
            raise TypeError(f"config must be an LMConfig, got {type(config).__name__}")
        self.config = config
        dtype, param_dtype = jnp.dtype(config.dtype), jnp.dtype(config.param_dtype)
        options = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)  # the embedding's, the final norm's, the head's
        self.embed = nnx.Embed(
            config.vocab_size, config.d_model, embedding_metadata=logical_param("vocab", "embed"), **options
        )
        if config.remat_policy != "none":
            checkpoint_policy(config.remat_policy)  # "offload" is refused here on a platform without host offload
        if config.scan_layers:
            self.periods = stacked_periods(config, Block, rngs=rngs)
        else:
            self.blocks = nnx.List([Block(config, kind, rngs=rngs) for kind in config.layer_kinds])
        self.final_norm = nnx.RMSNorm(
            config.d_model, epsilon=config.norm_eps, scale_metadata=logical_param("embed"), **options
        )
        self.head = (
            None
            if config.tie_embeddings
            else nnx.Linear(
                config.d_model,
                config.vocab_size,
                use_bias=False,
                kernel_metadata=logical_param("embed", "vocab"),
                **options,
            )
        )

    def forward_embeddings(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"],
        segment_ids: Int[Array, "B T"] | None = None,
        caches=None,
        mode: str = "forward",
    ) -> tuple[Float[Array, "B T V"], tuple | None]:
        """Blocks, final norm and head from input embeddings, every mixer in `mode`. A verify step runs the layers
        unscanned only.

        Args:
            x_BTD: the input embeddings [B, T, d_model].
            positions: RoPE positions [T] or [B, T].
            segment_ids: int [B, T], as in the mixers.
            caches (tuple | None): `LMCache.layers` to continue from (fresh ones for "prefill"); None for "forward".
            mode: "forward" (the full forward), "prefill", "decode" or "verify" (each mixer returns its caches after
                each token); the mixer method each runs (mixer_interface.py).

        Returns:
            logits: float32 [B, T, vocab_size].
            caches: the layers' new caches (or per-token caches), None for a full forward.
        """
        if (caches is None) != (check_mode(mode) == "forward"):
            raise ValueError(f"caches go with the modes {MODES[1:]} and only with them, got mode={mode!r}")
        if self.config.scan_layers:
            if mode == "verify":
                raise ValueError("a verify step needs scan_layers=False; convert_layers(model, False)")
            x_BTD, new_caches = run_scanned(
                self.periods,
                x_BTD,
                positions=positions,
                segment_ids=segment_ids,
                caches=caches,
                mode=mode,
                remat_policy=self.config.remat_policy,
            )
        else:
            run = block_runner(self.config.remat_policy, scanned=False)
            layer_caches = (None,) * len(self.blocks) if caches is None else caches
            new_caches = []
            for i, (block, cache) in enumerate(zip(self.blocks, layer_caches)):
                with jax.named_scope(f"layer{i}"):
                    if mode == "verify":  # outside remat: a verify step is never differentiated
                        x_BTD, cache = block(
                            x_BTD, positions=positions, segment_ids=segment_ids, cache=cache, mode=mode
                        )
                    else:
                        x_BTD, cache = run(block, x_BTD, positions, segment_ids, cache, mode)
                new_caches.append(cache)
            new_caches = None if caches is None else tuple(new_caches)
        x_BTD = self.final_norm(x_BTD)
        logits = self.embed.attend(x_BTD) if self.head is None else self.head(x_BTD)
        return constrain(logits.astype(jnp.float32), BTV), new_caches

    def __call__(
        self, tokens_BT: Int[Array, "B T"], *, segment_ids: Int[Array, "B T"] | None = None, debug_checks=False
    ) -> Float[Array, "B T V"]:
        """One full causal forward.

        Args:
            tokens_BT: token ids [B, T].
            segment_ids: int [B, T]: packed documents, kept apart in every mixer, RoPE positions restarting at each (see
                the module docstring). None: one document per row.
            debug_checks (bool): raise ValueError for token ids outside [0, vocab_size), also under jit.

        Returns:
            Logits [B, T, vocab_size], float32.
        """
        _check_tokens(tokens_BT, self.config.vocab_size, segment_ids, debug_checks)
        if segment_ids is None:
            positions = jnp.arange(tokens_BT.shape[1], dtype=jnp.int32)
        else:
            positions = document_positions(segment_ids)
        x_BTD = constrain(self.embed(tokens_BT), BTD)
        return self.forward_embeddings(x_BTD, positions=positions, segment_ids=segment_ids)[0]

    def init_caches(self, batch: int, max_len: int, *, step_tokens: int = 1) -> LMCache:
        """Empty caches for sequences of up to max_len tokens decoded in steps of up to step_tokens tokens.

        Args:
            batch: rows B.
            max_len: the longest sequence (prompt and generated) the caches hold: the A layers' KV slots.
            step_tokens: the most tokens one decode step feeds (a W layer's ring buffer holds window + step_tokens - 1).

        Returns:
            The caches, every layer's empty, length 0.
        """
        dtype = jnp.dtype(self.config.dtype)
        if self.config.scan_layers:
            layers = stacked_caches(self.config, Block, batch, max_len, dtype, step_tokens=step_tokens)
        else:
            layers = tuple(b.mixer.init_cache(batch, max_len, dtype, step_tokens=step_tokens) for b in self.blocks)
        zeros = jnp.zeros((batch,), jnp.int32)
        return LMCache(layers=layers, length=jnp.zeros((), jnp.int32), segment_id=zeros, position=zeros)

    def prefill(
        self,
        tokens_BT: Int[Array, "B T"],
        max_len: int,
        *,
        segment_ids: Int[Array, "B T"] | None = None,
        step_tokens: int = 1,
        debug_checks: bool = False,
    ) -> tuple[Float[Array, "B T V"], LMCache]:
        """Run a prompt and fill fresh caches for up to max_len tokens in all (compiled per shape).

        Args:
            tokens_BT: the prompt [B, T].
            max_len: the longest sequence the caches hold, >= T.
            segment_ids: int [B, T]: packed documents; None: one document per row.
            step_tokens: the most tokens a later `decode_step` feeds.
            debug_checks: as in `__call__`.

        Returns:
            logits: [B, T, vocab_size], float32.
            caches: for `decode_step`.
        """
        _check_tokens(tokens_BT, self.config.vocab_size, segment_ids, debug_checks)
        check_int("max_len", max_len)
        if max_len < tokens_BT.shape[1]:
            raise ValueError(f"max_len must be >= the prompt length {tokens_BT.shape[1]}, got {max_len}")
        graphdef, state = nnx.split(self)
        return _prefill(graphdef, state, tokens_BT, segment_ids, max_len=max_len, step_tokens=step_tokens)

    def decode_step(
        self,
        tokens_BN: Int[Array, "B n"],
        caches: LMCache,
        *,
        segment_ids: Int[Array, "B n"] | None = None,
        debug_checks: bool = False,
    ) -> tuple[Float[Array, "B n V"], LMCache]:
        """n new tokens after those in `caches` (compiled once per shape).

        The caches must have room: total length <= max_len for A layers, n <= step_tokens for W layers.

        Args:
            tokens_BN: the new tokens [B, n].
            caches: from `prefill`, `init_caches` or an earlier step.
            segment_ids: int [B, n]: None continues each row's last document; a new id starts one (an id that comes back
                too).
            debug_checks: as in `__call__`.

        Returns:
            logits: [B, n, vocab_size], float32.
            caches: the updated caches.
        """
        _check_tokens(tokens_BN, self.config.vocab_size, segment_ids, debug_checks)
        graphdef, state = nnx.split(self)
        return _decode(graphdef, state, tokens_BN, segment_ids, caches)

    def verify_step(self, tokens_BN: Int[Array, "B n"], caches: LMCache) -> tuple[Float[Array, "B n V"], tuple]:
        """A decode step of n tokens continuing each row's document that keeps what a rollback needs (compiled once per
        shape); `rollback` turns its per-token caches into the caches after the first m tokens.

        Args:
            tokens_BN: the tokens to check [B, n].
            caches: the caches before them.

        Returns:
            logits: [B, n, vocab_size], float32.
            verified: each layer's `verify` caches (each mixer's caches after each token), from the one step.
        """
        _check_tokens(tokens_BN, self.config.vocab_size)
        graphdef, state = nnx.split(self)
        return _verify(graphdef, state, tokens_BN, caches)

    def rollback(self, caches: LMCache, verified: tuple, kept) -> LMCache:
        """The caches after the first `kept` tokens of `verify_step(tokens, caches)`, equal to those of a decode step
        of just those tokens (float32 rounding) without running them again.

        Args:
            caches: the caches `verify_step` started from.
            verified: what it returned beside the logits.
            kept (int | Array): the tokens to keep, 0..n.

        Returns:
            The caches after those tokens.
        """
        graphdef, state = nnx.split(self)
        return _rollback(graphdef, state, caches, verified, jnp.asarray(kept, jnp.int32))

    def param_count(self) -> int:
        """The number of parameters (all nnx.Param leaves).

        Returns:
            The count; equals `count_params(config)`.
        """
        return sum(x.size for x in jax.tree.leaves(nnx.state(self, nnx.Param)))

    def flops_per_token(self, T: int) -> float:
        """Forward matmul FLOPs per token at sequence length T (see `flops_per_token`).

        Args:
            T: the sequence length.

        Returns:
            FLOPs per token.
        """
        return flops_per_token(self.config, T)


def convert_layers(model: LM, scan_layers: bool) -> LM:
    """The same model (the same parameters, layer for layer) with `config.scan_layers` set to `scan_layers`: the
    blocks stacked into scanned periods, or the stack split back into per-layer blocks (scan.py); `model` itself
    when it already has that form."""
    if not isinstance(scan_layers, bool):
        raise TypeError(f"scan_layers must be a bool, got {scan_layers!r}")
    config = model.config
    if config.scan_layers == scan_layers:
        return model
    target = dataclasses.replace(config, scan_layers=scan_layers)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: LM(target, rngs=nnx.Rngs(0))))
    convert = scan_state if scan_layers else unscan_state
    nnx.replace_by_pure_dict(abstract, convert(nnx.to_pure_dict(nnx.state(model)), config))
    return nnx.merge(graphdef, abstract)


def _check_tokens(tokens, vocab_size: int, segment_ids=None, debug_checks: bool = False) -> None:
    """tokens: an int array [B, T] of ids in [0, vocab_size) (checked when the values are known, or at run time
    with debug_checks); segment_ids None or [B, T]."""
    if getattr(tokens, "ndim", None) != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(
            f"tokens must be an int array [B, T] of ids < vocab_size={vocab_size}, got "
            f"{getattr(tokens, 'dtype', type(tokens).__name__)} {getattr(tokens, 'shape', None)}"
        )
    check_segment_ids(segment_ids, *tokens.shape)
    values = concrete(tokens)
    if values is not None and values.size and (values.min() < 0 or values.max() >= vocab_size):
        bad = values[(values < 0) | (values >= vocab_size)]
        raise ValueError(f"tokens must be ids in [0, vocab_size={vocab_size}), got {bad[:8].tolist()}")
    if debug_checks:
        outside = jnp.sum((tokens < 0) | (tokens >= vocab_size))
        message = f"tokens must be ids in [0, vocab_size={vocab_size}) (debug_checks), got {{}} outside"
        check_at_runtime([(message, outside > 0, outside)])


@partial(jax.jit, static_argnames=("graphdef", "max_len", "step_tokens"))
def _prefill(graphdef, state, tokens_BT, segment_ids_BT, *, max_len, step_tokens):
    model = nnx.merge(graphdef, state)
    B, T = tokens_BT.shape
    fresh = model.init_caches(B, max_len, step_tokens=step_tokens)
    if segment_ids_BT is None:
        positions, last_id = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T)), fresh.segment_id
    else:
        positions, last_id = document_positions(segment_ids_BT), segment_ids_BT[:, -1].astype(jnp.int32)
    x_BTD = model.embed(tokens_BT)
    logits, layers = model.forward_embeddings(
        x_BTD, positions=positions, segment_ids=segment_ids_BT, caches=fresh.layers, mode="prefill"
    )
    length = jnp.asarray(T, jnp.int32)
    return logits, LMCache(layers=layers, length=length, segment_id=last_id, position=positions[:, -1] + 1)


@partial(jax.jit, static_argnames=("graphdef",))
def _decode(graphdef, state, tokens_BN, segment_ids_BN, caches: LMCache):
    model = nnx.merge(graphdef, state)
    n = tokens_BN.shape[1]
    if segment_ids_BN is None:
        positions, last_id = caches.position[:, None] + jnp.arange(n, dtype=jnp.int32), caches.segment_id
    else:
        positions = document_positions(segment_ids_BN, caches.segment_id, caches.position)
        last_id = segment_ids_BN[:, -1].astype(jnp.int32)
    logits, layers = model.forward_embeddings(
        model.embed(tokens_BN), positions=positions, segment_ids=segment_ids_BN, caches=caches.layers, mode="decode"
    )
    caches = LMCache(layers=layers, length=caches.length + n, segment_id=last_id, position=positions[:, -1] + 1)
    return logits, caches


@partial(jax.jit, static_argnames=("graphdef",))
def _verify(graphdef, state, tokens_BN, caches: LMCache):
    model = nnx.merge(graphdef, state)
    positions = caches.position[:, None] + jnp.arange(tokens_BN.shape[1], dtype=jnp.int32)
    embeddings = model.embed(tokens_BN)
    return model.forward_embeddings(embeddings, positions=positions, caches=caches.layers, mode="verify")


@partial(jax.jit, static_argnames=("graphdef",))
def _rollback(graphdef, state, caches: LMCache, verified: tuple, kept):
    model = nnx.merge(graphdef, state)
    layers = tuple(b.mixer.rollback(c, v, kept) for b, c, v in zip(model.blocks, caches.layers, verified))
    return caches._replace(layers=layers, length=caches.length + kept, position=caches.position + kept)
