"""The Mamba2 mixer (layer letter M; Dao and Gu 2024, "Transformers are SSMs") and its registry entry.

As the paper builds it, with d_inner = expand * d_model in heads of head_dim P (H = d_inner / P) and n_groups
groups of B and C (state size N each, shared by the H / n_groups heads of a group):
- one input projection of x [B, T, D] to z (d_inner, the gate), x (d_inner), B and C (n_groups * N each), dt (H);
- a causal depthwise convolution of `conv_size` taps (with a bias) over x, B and C (0: none), then SiLU;
- dt = softplus(dt + dt_bias) per head (dt_bias set so dt starts log-uniform in DT_RANGE), A = -exp(A_log) per
  head (A_log = log of uniform in A_RANGES[decay_init]: Mamba2's [1, 16], or [1/64, 1/4] for a long memory);
- the SSD recurrence per head, S_t = exp(dt_t A) S_{t-1} + B_t (dt_t x_t)^T, y_t = S_t^T C_t, which is
  `retention.ops.linear_attention` with log_g = dt A, keys B, queries C, values dt x and scale 1;
- y + D x (a skip per head), the gated RMSNorm norm(y * SiLU(z)) over each group's d_inner / n_groups channels,
  the output projection.

The `Mixer` methods (mixer_interface.py) and the cache (MatrixStateCache: S [B, H, N, P] float32, each row's last
segment id, the conv cache of x, B and C) as the Gated DeltaNet mixer's (`matrix_state.py`).
"""

import math
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from retention.nn.conv import QKVConv, check_conv_size
from retention.nn.matrix_state import (
    MatrixStateCache,
    MatrixStateMixer,
    run_mixing,
    state_bytes,
)
from retention.nn.mixer_kind import MixerKind
from retention.nn.qkv import conv_cache_bytes, mixer_options
from retention.ops import (
    check_chunk_size,
    linear_attention,
    linear_attention_context_parallel,
    linear_attention_step,
)
from retention.ops.chunking import default_chunk_size
from retention.ops.linear_attention.op import PREFERRED_CHUNK
from retention.parallel.rules import logical_param
from retention.validation import check_choice, check_int

DT_RANGE = (1e-3, 1e-1)  # the initial step sizes dt, log-uniform
A_RANGES = {  # the initial rates A = exp(A_log), uniform, by `decay_init` (DESIGN section 3, the recipe table)
    "paper": (1.0, 16.0),  # Mamba2's: a per-token decay exp(-A dt) near 0.92 at dt's median, so 0.02 after 48 tokens
    "long": (1 / 64, 1 / 4),  # 64 times slower: near 0.9987 per token at dt's median, 0.94 after 48 tokens
}
DECAY_INITS = tuple(A_RANGES)
NORM_EPS = 1e-5


def init_decay(
    rngs: nnx.Rngs, heads: int, param_dtype, heads_axis: str, decay_init: str = "paper"
) -> tuple[nnx.Param, nnx.Param]:
    """Mamba2's decay parameters per head (logical axis `heads_axis`): dt_bias with softplus(dt_bias) log-uniform
    in DT_RANGE, and A_log the log of a uniform draw in A_RANGES[decay_init] ("paper": Mamba2's [1, 16]; "long":
    [1/64, 1/4], a memory 64 times longer at the start)."""
    check_choice("decay_init", decay_init, DECAY_INITS)
    names = logical_param(heads_axis)
    low, high = math.log(DT_RANGE[0]), math.log(DT_RANGE[1])
    dt = jnp.exp(jax.random.uniform(rngs.params(), (heads,), minval=low, maxval=high))
    dt_bias = nnx.Param((dt + jnp.log(-jnp.expm1(-dt))).astype(param_dtype), **names)  # the inverse of softplus
    a_low, a_high = A_RANGES[decay_init]
    A = jax.random.uniform(rngs.params(), (heads,), minval=a_low, maxval=a_high)
    return dt_bias, nnx.Param(jnp.log(A).astype(param_dtype), **names)


def check_mamba2_dims(d_model: int, head_dim: int, state_size: int, expand: int, n_groups: int, *, names) -> int:
    """The Mamba2 sizes are positive ints, expand * d_model is a whole number of heads of head_dim and the heads
    split evenly into n_groups; `names` are the arguments' names for the errors. Returns the number of heads."""
    values = (d_model, head_dim, state_size, expand, n_groups)
    for name, value in zip(names, values):
        check_int(name, value)
    d, p, _, e, g = names
    if (expand * d_model) % head_dim:
        raise ValueError(
            f"{e} * {d} must be a multiple of {p} (whole heads), got {e}={expand}, {d}={d_model}, {p}={head_dim}"
        )
    heads = expand * d_model // head_dim
    if heads % n_groups:
        raise ValueError(f"{g} must divide the {heads} heads ({e} * {d} / {p}), got {g}={n_groups}")
    return heads


class Mamba2(MatrixStateMixer, nnx.Module):
    """The Mamba2 mixer (module docstring): its SSD through `linear_attention`.

    Args:
        d_model: the model width.
        head_dim: P, the values per head; H = expand * d_model / head_dim heads.
        state_size: N, the state size of each group of B and C.
        expand: d_inner = expand * d_model.
        n_groups: groups of B and C, each shared by H / n_groups heads.
        conv_size: taps of the short convolution over x, B and C; 0: none.
        decay_init: A's initial range (A_RANGES): "paper", Mamba2's [1, 16], or "long", [1/64, 1/4].
        chunk_size: the op's chunk size; None: its default.
        dtype (DTypeLike): the compute dtype; the state is float32.
        param_dtype (DTypeLike): the parameters' dtype.
        rngs: the initialisation.
    """

    def __init__(
        self,
        d_model: int,
        *,
        head_dim: int,
        state_size: int,
        expand: int = 2,
        n_groups: int = 1,
        conv_size: int = 0,
        decay_init: str = "paper",
        chunk_size: int | None = None,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        names = ("d_model", "head_dim", "state_size", "expand", "n_groups")
        self.heads = check_mamba2_dims(d_model, head_dim, state_size, expand, n_groups, names=names)
        check_conv_size("conv_size", conv_size)
        check_chunk_size(chunk_size)
        self.head_dim, self.state_size, self.n_groups, self.chunk_size = head_dim, state_size, n_groups, chunk_size
        self.d_inner = expand * d_model
        bc = n_groups * state_size
        linear = lambda i, o, *names: nnx.Linear(
            i, o, use_bias=False, kernel_metadata=logical_param(*names), dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        self.in_proj = linear(d_model, 2 * self.d_inner + 2 * bc + self.heads, "embed", "ssm_proj")
        conv_axes = ("ssm_heads", "ssm_groups")
        self.conv = (
            QKVConv(self.d_inner, bc, conv_size, conv_axes, param_dtype=param_dtype, rngs=rngs) if conv_size else None
        )
        if conv_size:
            bound = conv_size**-0.5  # PyTorch's Conv1d bias for a depthwise filter
            shape = (self.d_inner + 2 * bc,)
            bias = jax.random.uniform(rngs.params(), shape, param_dtype, -bound, bound)
            self.conv_bias = nnx.Param(bias, **logical_param("ssm_proj"))
        self.dt_bias, self.A_log = init_decay(rngs, self.heads, param_dtype, "ssm_heads", decay_init)
        self.D = nnx.Param(jnp.ones((self.heads,), param_dtype), **logical_param("ssm_heads"))
        self.norm = nnx.RMSNorm(
            self.d_inner // n_groups, epsilon=NORM_EPS, use_scale=False, dtype=jnp.float32, rngs=rngs
        )
        self.norm_scale = nnx.Param(jnp.ones((self.d_inner,), param_dtype), **logical_param("ssm_heads"))
        self.out_proj = linear(self.d_inner, d_model, "ssm_heads", "embed")

    def _mix(
        self,
        x_BTD: Float[Array, "B T D"],
        positions: Int[Array, "*b T"] | None,
        segment_ids: Int[Array, "B T"] | None,
        cache: MatrixStateCache | None,
        *,
        per_token: bool,
    ) -> tuple[Float[Array, "B T D"], MatrixStateCache | None]:
        """The body of every mode (`MatrixStateMixer`): the full forward (cache None) or T tokens continuing the
        cache (rows whose first token starts a new document begin from an empty state).

        Args:
            x_BTD: the normalised residual stream [B, T, d_model].
            positions: unused (the recurrence orders the tokens).
            segment_ids: int [B, T], or None.
            cache: the layer's cache to continue; None: a full forward.
            per_token: a verify step: return the caches after each token.

        Returns:
            y: [B, T, d_model].
            cache: the new cache or None; with `per_token` the caches after each token stacked [T, ...]
                (`matrix_state.run_mixing`).
        """
        B, T, _ = x_BTD.shape
        H, P, G, N = self.heads, self.head_dim, self.n_groups, self.state_size
        bc = G * N
        cuts = [self.d_inner, 2 * self.d_inner, 2 * self.d_inner + bc, 2 * self.d_inner + 2 * bc]
        z, xs, Bs, Cs, dt = jnp.split(self.in_proj(x_BTD), cuts, axis=-1)
        conv_cache = None if cache is None else cache.conv
        conv_per_token = None
        if self.conv is not None and per_token:
            conv_per_token = self.conv.per_token_caches(xs, Bs, Cs, segment_ids_BT=segment_ids, cache=conv_cache)
        if self.conv is not None:
            xs, Bs, Cs, conv_cache = self.conv(xs, Bs, Cs, segment_ids_BT=segment_ids, cache=conv_cache)
            bias = jnp.split(self.conv_bias[...].astype(xs.dtype), cuts[:1] + [self.d_inner + bc], axis=-1)
            xs, Bs, Cs = (a + b for a, b in zip((xs, Bs, Cs), bias))
        x_BTHP = jax.nn.silu(xs).reshape(B, T, H, P).astype(jnp.float32)
        per_head = lambda m: jnp.repeat(jax.nn.silu(m).reshape(B, T, G, N), H // G, axis=2)  # head h: group h // (H/G)
        dt_BTH = jax.nn.softplus(dt.astype(jnp.float32) + self.dt_bias[...])
        log_g = dt_BTH * -jnp.exp(self.A_log[...].astype(jnp.float32))
        y, cache = run_mixing(
            partial(linear_attention, scale=1.0),
            partial(linear_attention_context_parallel, scale=1.0),
            partial(linear_attention_step, scale=1.0),
            (per_head(Cs), per_head(Bs), x_BTHP * dt_BTH[..., None], log_g),
            cache=cache,
            conv_cache=conv_per_token if per_token else conv_cache,
            segment_ids=segment_ids,
            chunk_size=self.chunk_size,
            per_token=per_token,
        )
        y = y + self.D[...].astype(jnp.float32)[:, None] * x_BTHP
        gated = (y.reshape(B, T, self.d_inner) * jax.nn.silu(z.astype(jnp.float32))).reshape(B, T, G, -1)
        y = self.norm(gated).reshape(B, T, self.d_inner) * self.norm_scale[...].astype(jnp.float32)
        return self.out_proj(y.astype(x_BTD.dtype)), cache

    @property
    def state_dims(self) -> tuple[int, int, int]:
        """The state's (heads, d_k, d_v)."""
        return (self.heads, self.state_size, self.head_dim)


def _build(config, *, rngs: nnx.Rngs) -> Mamba2:
    return Mamba2(
        config.d_model,
        state_size=config.ssm_state_size,
        expand=config.ssm_expand,
        n_groups=config.ssm_groups,
        decay_init=config.decay_init,
        chunk_size=config.chunk_size,
        **mixer_options(config, qkv=False, rope=False),
        rngs=rngs,
    )


def _sizes(config) -> tuple[int, int, int]:
    """(d_inner, heads, b_and_c: the channels of B and C together)."""
    d_inner = config.ssm_expand * config.d_model
    return d_inner, d_inner // config.head_dim, 2 * config.ssm_groups * config.ssm_state_size


def _matmul_params(config) -> int:
    """The input projection (z, x, B, C, dt) and the output projection."""
    d_inner, H, b_and_c = _sizes(config)
    return config.d_model * (2 * d_inner + b_and_c + H) + d_inner * config.d_model


def _params(config) -> int:
    """The projections, the convolution's taps and bias over x, B and C, dt_bias, A_log and D per head, the
    norm's scale."""
    d_inner, H, b_and_c = _sizes(config)
    conv = (config.conv_size + 1) * (d_inner + b_and_c) if config.conv_size else 0
    return _matmul_params(config) + conv + 3 * H + d_inner


def _mixing_flops(config, T: int) -> float:
    """Per token and head (state N x P): the state write and read 2 N P each; inside the chunk 2 c N for the
    scores C.B and 2 c P for their product with the values; 2 per convolution tap."""
    d_inner, H, b_and_c = _sizes(config)
    N, P = config.ssm_state_size, config.head_dim
    c = config.chunk_size or default_chunk_size(T, PREFERRED_CHUNK)
    return H * (4 * N * P + 2 * c * (N + P)) + 2 * config.conv_size * (d_inner + b_and_c)


def _cache_bytes(config, batch: int, max_len: int, step_tokens: int = 1) -> int:
    """S [H, N, P] in float32 and each row's last segment id, the conv cache of x, B and C."""
    d_inner, H, b_and_c = _sizes(config)
    return state_bytes(batch, H, config.ssm_state_size, config.head_dim) + conv_cache_bytes(
        config, batch, d_inner + b_and_c
    )


MAMBA2 = MixerKind(
    "Mamba2",
    _build,
    _params,
    _matmul_params,
    _mixing_flops,
    _cache_bytes,
    fixed_state=True,
    step_bounded=False,
    recipe=("decay_init",),
)
