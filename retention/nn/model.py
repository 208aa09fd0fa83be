"""The language model: token embedding, pre-norm blocks (RMSNorm, mixer, RMSNorm, SwiGLU MLP), final norm, head.

`config.pattern` is a string over P (power retention), A (full attention) and W (sliding-window attention);
layer i gets pattern[i % len(pattern)], with n_layers >= len(pattern) so that every letter gets a layer.
`LM.prefill` runs a prompt through the full-sequence paths and leaves per-layer caches; `LM.decode_step`
continues from them, compiled once per shape (positions come from the caches, traced), so prefill-then-decode
gives the logits of one full forward.
Packed documents: `segment_ids` [B, T] (every entry point takes them) keep documents apart in every mixer, and
RoPE positions restart at 0 at each document (`layers.document_positions`); LMCache records each row's last
segment id and next position, so a decode step continues a document (segment_ids None, or the same id) or starts
one (a new id), and prefill of a packed prompt then decode equals the documents run one by one.
"""

import dataclasses
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from retention.nn.conv import check_conv_size
from retention.nn.layers import SwiGLU, check_heads, check_rope_base, document_positions
from retention.nn.mixers import GATE_BIAS_INIT, Attention, PowerRetention
from retention.ops import ATTENTION_IMPLS, RETENTION_IMPLS, check_chunk_size, check_deg, sympow_dim
from retention.ops.attention import KV_CACHE_BITS
from retention.ops.power_retention import default_chunk_size
from retention.ops.validation import check_segment_ids
from retention.validation import check_at_runtime, check_choice, check_int, check_number, concrete

MIXERS = {"P": "power retention", "A": "full attention", "W": "sliding-window attention"}
FLOAT_DTYPES = ("float32", "bfloat16", "float16")


def check_pattern(pattern, n_layers: int) -> None:
    """pattern is a non-empty string over MIXERS' letters, no longer than n_layers: the pattern repeats over the
    layers, and one cut short would silently drop letters (PPPA at 2 layers is PP, with no attention)."""
    if not isinstance(pattern, str) or not pattern or set(pattern) - set(MIXERS):
        raise ValueError(f"pattern must be a non-empty string over the letters {MIXERS}, got {pattern!r}")
    if n_layers < len(pattern):
        raise ValueError(
            f"pattern={pattern!r} needs n_layers >= {len(pattern)} (at least one layer per letter; it repeats over "
            f"the layers), got n_layers={n_layers}, which would build only {pattern[:n_layers]!r}"
        )


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Hyperparameters of `LM`; validated on construction (a bad field raises ValueError naming it)."""

    vocab_size: int = 256
    d_model: int = 512
    n_layers: int = 8
    pattern: str = "PPPA"
    n_heads: int = 8
    n_kv_heads: int = 8
    head_dim: int = 64
    mlp_ratio: float = 8 / 3
    deg: int = 2
    window: int = 512
    rope_base: float | None = 10000.0
    tie_embeddings: bool = True
    dtype: str = "float32"  # compute dtype (activations, KV cache); the retention state is always float32
    param_dtype: str = "float32"
    gating: bool = True  # P layers: a learnt per-kv-head decay gate
    gate_bias_init: float = GATE_BIAS_INIT  # P layers: the gate's initial bias (sigmoid(4) = 0.98, a slow decay)
    qk_norm: bool = False  # every layer: RMSNorm over the head dim of q and k
    conv_size: int = 0  # every layer: a causal depthwise convolution of this many taps on q, k and v (0: none)
    chunk_size: int | None = None
    retention_impl: str = "auto"  # the P layers' op path (power_retention's impl)
    attention_impl: str = "auto"  # the A and W layers' op path (softmax_attention's impl)
    kv_cache_bits: int | None = None  # the A and W layers' decode cache: float (None) or quantized (8, 4 bits)

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "window"):
            check_int(name, getattr(self, name))
        check_heads(self.n_heads, self.n_kv_heads, self.head_dim, names=("n_heads", "n_kv_heads", "head_dim"))
        check_pattern(self.pattern, self.n_layers)
        check_deg(self.deg)
        check_number("gate_bias_init", self.gate_bias_init)
        check_conv_size("conv_size", self.conv_size)
        check_number("mlp_ratio", self.mlp_ratio, low=0, open_low=True)
        check_rope_base(self.rope_base, self.head_dim)
        for name in ("dtype", "param_dtype"):
            check_choice(name, getattr(self, name), FLOAT_DTYPES)
        check_chunk_size(self.chunk_size)
        check_choice("retention_impl", self.retention_impl, RETENTION_IMPLS)
        check_choice("attention_impl", self.attention_impl, ATTENTION_IMPLS)
        check_choice("kv_cache_bits", self.kv_cache_bits, (None, *KV_CACHE_BITS))

    @property
    def layer_kinds(self) -> str:
        """The mixer letter of each layer: the pattern repeated over n_layers (every letter appears)."""
        return "".join(self.pattern[i % len(self.pattern)] for i in range(self.n_layers))

    @property
    def mlp_hidden(self) -> int:
        """The SwiGLU hidden width: mlp_ratio * d_model rounded to a multiple of 8."""
        return 8 * max(1, round(self.mlp_ratio * self.d_model / 8))


def _mixer_matmul_params(config: LMConfig, kind: str) -> int:
    """Weights of one mixer's projections (q, k, v, o, and the gate for P)."""
    D, Hq, H, d = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim
    qkvo = 2 * D * Hq * d + 2 * D * H * d
    return qkvo + (D * H if kind == "P" and config.gating else 0)


def _conv_taps(config: LMConfig) -> int:
    """Kernel weights of one mixer's short convolutions: conv_size per channel of q, k and v."""
    return config.conv_size * (config.n_heads + 2 * config.n_kv_heads) * config.head_dim


def _matmul_params(config: LMConfig) -> int:
    """Weights that multiply activations, per token: mixer projections, MLPs and the head (tied or not)."""
    mlp = 3 * config.d_model * config.mlp_hidden
    mixers = sum(_mixer_matmul_params(config, kind) for kind in config.layer_kinds)
    return mixers + config.n_layers * mlp + config.vocab_size * config.d_model


def count_params(config: LMConfig) -> int:
    """The parameter count of LM(config), from the config alone (equals LM.param_count())."""
    D, d, H = config.d_model, config.head_dim, config.n_kv_heads
    total = _matmul_params(config) + (0 if config.tie_embeddings else config.vocab_size * D)
    total += (2 * config.n_layers + 1) * D  # block norms and the final norm
    total += config.n_layers * (_conv_taps(config) + (2 * d if config.qk_norm else 0))
    total += config.layer_kinds.count("P") * (H if config.gating else 0)  # the gates' biases
    return total


def flops_per_token(config: LMConfig, T: int) -> float:
    """Forward matmul FLOPs per token over a sequence of T tokens (DESIGN section 1): 2 per matmul weight, plus
    per layer and query head 2*T*d for causal softmax (averaged over positions), 2*min(window, T)*d for a window,
    and for power retention 2*D*d per kv head (state write) and per query head (read) plus 2*c*d in the chunk;
    the short convolutions add 2 per tap and channel."""
    Hq, H, d = config.n_heads, config.n_kv_heads, config.head_dim
    c = config.chunk_size or default_chunk_size(T)
    D_phi = sympow_dim(d, config.deg)
    per_kind = {
        "A": 2 * T * d * Hq,
        "W": 2 * min(config.window, T) * d * Hq,
        "P": 2 * D_phi * d * (H + Hq) + 2 * c * d * Hq,
    }
    convs = 2 * _conv_taps(config) * config.n_layers
    return 2 * _matmul_params(config) + convs + sum(per_kind[kind] for kind in config.layer_kinds)


def size_config(base: LMConfig, target_params: int, *, multiple: int = 8) -> LMConfig:
    """`base` with d_model (a multiple of `multiple`; heads, head dim and layers kept) chosen so the parameter
    count is as close as possible to `target_params`: sizes softmax, retention and hybrid models alike."""
    check_int("target_params", target_params)
    check_int("multiple", multiple)
    with_width = lambda width: dataclasses.replace(base, d_model=width)
    lo, hi = 1, 2
    while count_params(with_width(hi * multiple)) < target_params:  # the count grows with d_model
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count_params(with_width(mid * multiple)) < target_params else (lo, mid)
    best = min((lo, hi), key=lambda m: abs(count_params(with_width(m * multiple)) - target_params))
    return with_width(best * multiple)


class LMCache(NamedTuple):
    """Per-layer mixer caches (RetentionCache for P, AttentionCache for A and W), the tokens seen so far, and per
    row the segment id of the last token and the RoPE position of the next one."""

    layers: tuple
    length: Int[Array, ""]
    segment_id: Int[Array, " B"]
    position: Int[Array, " B"]


class Block(nnx.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LMConfig, kind: str, *, rngs: nnx.Rngs):
        dtype, param_dtype = jnp.dtype(config.dtype), jnp.dtype(config.param_dtype)
        common = dict(
            heads=config.n_heads,
            kv_heads=config.n_kv_heads,
            head_dim=config.head_dim,
            qk_norm=config.qk_norm,
            conv_size=config.conv_size,
            rope_base=config.rope_base,
            dtype=dtype,
            param_dtype=param_dtype,
            rngs=rngs,
        )
        norm = lambda: nnx.RMSNorm(config.d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.mixer_norm = norm()
        if kind == "P":
            self.mixer = PowerRetention(
                config.d_model,
                deg=config.deg,
                gating=config.gating,
                gate_bias_init=config.gate_bias_init,
                chunk_size=config.chunk_size,
                impl=config.retention_impl,
                **common,
            )
        else:
            window = config.window if kind == "W" else None
            self.mixer = Attention(
                config.d_model, window=window, impl=config.attention_impl, kv_cache_bits=config.kv_cache_bits, **common
            )
        self.mlp_norm = norm()
        self.mlp = SwiGLU(config.d_model, config.mlp_hidden, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x_BTD, *, positions, segment_ids=None, cache=None, prefill: bool = False):
        """Returns (x [B, T, D], the mixer's new cache): its full forward, prefill or decode step."""
        h = self.mixer_norm(x_BTD)
        run = self.mixer.prefill if prefill else self.mixer
        h, cache = run(h, positions=positions, segment_ids=segment_ids, cache=cache)
        x_BTD = x_BTD + h
        return x_BTD + self.mlp(self.mlp_norm(x_BTD)), cache


class LM(nnx.Module):
    """Decoder-only language model over `config.layer_kinds`; logits are float32 [B, T, vocab_size]."""

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, LMConfig):
            raise TypeError(f"config must be an LMConfig, got {type(config).__name__}")
        self.config = config
        dtype, param_dtype = jnp.dtype(config.dtype), jnp.dtype(config.param_dtype)
        self.embed = nnx.Embed(config.vocab_size, config.d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.blocks = nnx.List([Block(config, kind, rngs=rngs) for kind in config.layer_kinds])
        self.final_norm = nnx.RMSNorm(config.d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.head = (
            None
            if config.tie_embeddings
            else nnx.Linear(
                config.d_model, config.vocab_size, use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs
            )
        )

    def forward_embeddings(
        self,
        x_BTD: Float[Array, "B T D"],
        *,
        positions: Int[Array, "*b T"],
        segment_ids: Int[Array, "B T"] | None = None,
        caches=None,
        prefill: bool = False,
    ) -> tuple[Float[Array, "B T V"], tuple | None]:
        """Blocks, final norm and head from input embeddings; `caches` (one per layer) and segment_ids as in the
        mixers, positions [T] or [B, T] (RoPE's)."""
        layer_caches = (None,) * len(self.blocks) if caches is None else caches
        new_caches = []
        for block, cache in zip(self.blocks, layer_caches):
            x_BTD, cache = block(x_BTD, positions=positions, segment_ids=segment_ids, cache=cache, prefill=prefill)
            new_caches.append(cache)
        x_BTD = self.final_norm(x_BTD)
        logits = self.embed.attend(x_BTD) if self.head is None else self.head(x_BTD)
        return logits.astype(jnp.float32), None if caches is None else tuple(new_caches)

    def __call__(
        self, tokens_BT: Int[Array, "B T"], *, segment_ids: Int[Array, "B T"] | None = None, debug_checks=False
    ) -> Float[Array, "B T V"]:
        """One full causal forward: logits [B, T, vocab_size]. segment_ids [B, T]: packed documents (see the module
        docstring). debug_checks: raise ValueError for token ids outside [0, vocab_size), also under jit."""
        _check_tokens(tokens_BT, self.config.vocab_size, segment_ids, debug_checks)
        if segment_ids is None:
            positions = jnp.arange(tokens_BT.shape[1], dtype=jnp.int32)
        else:
            positions = document_positions(segment_ids)
        x_BTD = self.embed(tokens_BT)
        return self.forward_embeddings(x_BTD, positions=positions, segment_ids=segment_ids)[0]

    def init_caches(self, batch: int, max_len: int, *, step_tokens: int = 1) -> LMCache:
        """Empty caches for sequences of up to max_len tokens decoded in steps of up to step_tokens tokens."""
        dtype = jnp.dtype(self.config.dtype)
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
        """Run a prompt (packed with segment_ids, or one document per row) and fill fresh caches for up to max_len
        tokens in all (compiled per shape). Returns (logits [B, T, V], caches) for `decode_step` with steps of up
        to step_tokens tokens. debug_checks as in `__call__`."""
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
        """n new tokens after those in `caches`: (logits [B, n, V], updated caches). Compiled once per shape.
        segment_ids None continues each row's last document; a new id starts one (an id that comes back too). The
        caches must have room: total length <= max_len for A layers, n <= step_tokens for W layers. debug_checks as
        in `__call__`."""
        _check_tokens(tokens_BN, self.config.vocab_size, segment_ids, debug_checks)
        graphdef, state = nnx.split(self)
        return _decode(graphdef, state, tokens_BN, segment_ids, caches)

    def param_count(self) -> int:
        """The number of parameters (all nnx.Param leaves)."""
        return sum(x.size for x in jax.tree.leaves(nnx.state(self, nnx.Param)))

    def flops_per_token(self, T: int) -> float:
        """Forward matmul FLOPs per token at sequence length T (see `flops_per_token`)."""
        return flops_per_token(self.config, T)


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
    options = dict(positions=positions, segment_ids=segment_ids_BT, caches=fresh.layers, prefill=True)
    logits, layers = model.forward_embeddings(x_BTD, **options)
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
    options = dict(positions=positions, segment_ids=segment_ids_BN, caches=caches.layers)
    logits, layers = model.forward_embeddings(model.embed(tokens_BN), **options)
    caches = LMCache(layers=layers, length=caches.length + n, segment_id=last_id, position=positions[:, -1] + 1)
    return logits, caches
