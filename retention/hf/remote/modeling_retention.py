"""A retention export in plain PyTorch, for `transformers.AutoModelForCausalLM.from_pretrained(export,
trust_remote_code=True)`: every layer letter (P power retention, A softmax attention, W sliding-window attention, D
Gated DeltaNet, G GLA, M Mamba2) with the short convolution, QK-norm, gates, GQA and RoPE (with its linear or llama3
scaling) as the export's LMConfig (config.json's `retention_lm`) says, the same blocks (pre-norm, SwiGLU MLP or none
when mlp_width is 0) and a tied or untied head.

This is a reference implementation, not a fast one: every mixer runs its recurrence token by token (softmax attention
reads a growing KV cache), in float32 whatever the weights' dtype, with no Triton and no custom kernels. A full
forward and `generate` share that one path: a forward with `use_cache` returns a `RetentionCache` (per layer the
recurrent state, or the keys and values of A and W, and the short convolution's last inputs) that the next call
continues, so `model.generate(..., use_cache=True)` feeds one new token a step. An `attention_mask` (left padding)
is honoured: a padded token changes no state and is no key, its stream is held at zero, and RoPE positions count
the real tokens only.

Parameters are named as the export's tensors (the retention layout: `blocks.0.mixer.q_proj.kernel.value`, a
Linear's kernel [in, out]; with scan_layers `periods.blocks.j...` stacked over the repeats), so transformers loads
model.safetensors with no renaming. Written into every export in the retention layout by retention/export.py; the
retention package never imports it.
"""

import math
from functools import cache
from itertools import combinations_with_replacement

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_retention import RetentionConfig

GLA_GATE_NORMALISER = 16.0  # retention/nn/gla.py: GLA's log-gates are divided by this
MAMBA2_NORM_EPS = 1e-5  # retention/nn/mamba2.py: the gated RMSNorm's epsilon
OUTPUT_NORM_EPS = 1e-6  # the output RMSNorm of D and G
L2_EPS = 1e-6  # Gated DeltaNet's L2 normalisation of q and k
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def for_kind(lm: dict, letter: str) -> dict:
    """The LMConfig fields the `letter` layers are built from: `lm` with lm["layers"][letter] applied (a layer
    without RoPE drops rope_scaling too), as `LMConfig.for_kind`.

    Args:
        lm: the export's LMConfig as a dict.
        letter: a layer letter.

    Returns:
        The fields as a dict.
    """
    settings = dict((lm.get("layers") or {}).get(letter, {}))
    if settings.get("rope_base", lm["rope_base"]) is None:
        settings["rope_scaling"] = "none"
    return {**lm, **settings}


def rope_frequencies(head_dim: int, base: float, lm: dict) -> torch.Tensor:
    """RoPE's [head_dim / 2] float32 angular frequencies base^(-2i/d), rescaled as lm's rope_scaling says ("linear":
    divided by rope_factor; "llama3": Llama 3.1's blend), as retention/nn/rope.py computes them.

    Args:
        head_dim: d.
        base: RoPE's base.
        lm: the layer's fields (rope_scaling, rope_factor, rope_low_freq_factor, rope_high_freq_factor,
            rope_original_max_len).

    Returns:
        The frequencies.
    """
    inv_freq = base ** (-2.0 * torch.arange(head_dim // 2, dtype=torch.float32) / head_dim)
    kind, factor = lm["rope_scaling"], lm["rope_factor"]
    if kind == "none":
        return inv_freq
    if kind == "linear":
        return inv_freq / factor
    low, high, original = lm["rope_low_freq_factor"], lm["rope_high_freq_factor"], lm["rope_original_max_len"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x [B, H, d] rotated by each row's position [B] (the pairs (x_i, x_{i + d/2}), Llama's rotate_half)."""
    angles = positions.float()[:, None] * inv_freq.to(x.device)  # [B, d/2]
    cos, sin = torch.cos(angles)[:, None, :], torch.sin(angles)[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rms_norm(x: torch.Tensor, scale: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) over the last axis, times scale (None: none)."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if scale is None else y * scale


def keep(live: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """new where the row's token is real (live [B]), else old: a padded token changes no state."""
    return torch.where(live.view(-1, *([1] * (new.dim() - 1))), new, old)


class Leaf(nn.Module):
    """One tensor of the export, the parameter `value` (so its name ends in ".value", as the export's). With
    scan_layers it is stacked over the repeats: `index` (set by the model before each layer) picks the repeat."""

    def __init__(self, lead: tuple, *shape: int):
        super().__init__()
        self.value = nn.Parameter(torch.zeros(*lead, *shape))
        self.index = None

    def get(self) -> torch.Tensor:
        """The tensor (of the current repeat) in float32."""
        value = self.value if self.index is None else self.value[self.index]
        return value.float()


class Linear(nn.Module):
    """x @ kernel (+ bias): the kernel [in, out] as Flax stores it."""

    def __init__(self, lead: tuple, n_in: int, n_out: int, bias: bool = False):
        super().__init__()
        self.kernel = Leaf(lead, n_in, n_out)
        self.bias = Leaf(lead, n_out) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.kernel.get()
        return y if self.bias is None else y + self.bias.get()


class RMSNorm(nn.Module):
    """RMSNorm with a learnt scale (named `scale`, as Flax's)."""

    def __init__(self, lead: tuple, n: int, eps: float):
        super().__init__()
        self.scale, self.eps = Leaf(lead, n), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.scale.get(), self.eps)


class ShortConv(nn.Module):
    """A causal depthwise convolution, kernel [K, C] (tap K - 1 the current token); its state the last K - 1 inputs."""

    def __init__(self, lead: tuple, channels: int, size: int):
        super().__init__()
        self.kernel, self.size = Leaf(lead, size, channels), size

    def step(self, x: torch.Tensor, past: torch.Tensor, live: torch.Tensor):
        """(y [B, C], the new past [B, K - 1, C]) of one token x [B, C] after the inputs `past`."""
        window = torch.cat([past, x[:, None]], dim=1)
        return (window * self.kernel.get()).sum(1), keep(live, window[:, 1:], past)

    def empty(self, batch: int, device) -> torch.Tensor:
        """Zero inputs before the first token."""
        return torch.zeros(batch, self.size - 1, self.kernel.value.shape[-1], device=device)


class QKVConv(nn.Module):
    """A ShortConv on each of q, k and v (named q, k, v)."""

    def __init__(self, lead: tuple, q_channels: int, kv_channels: int, size: int):
        super().__init__()
        self.q = ShortConv(lead, q_channels, size)
        self.k = ShortConv(lead, kv_channels, size)
        self.v = ShortConv(lead, kv_channels, size)

    def step(self, xs: tuple, pasts: tuple, live: torch.Tensor):
        """((q, k, v) convolved, their new pasts) of one token."""
        out = [conv.step(x, past, live) for conv, x, past in zip((self.q, self.k, self.v), xs, pasts)]
        return tuple(y for y, _ in out), tuple(p for _, p in out)

    def empty(self, batch: int, device) -> tuple:
        return tuple(conv.empty(batch, device) for conv in (self.q, self.k, self.v))


class QKNorm(nn.Module):
    def __init__(self, lead: tuple, head_dim: int, eps: float):
        super().__init__()
        self.q_norm, self.k_norm = RMSNorm(lead, head_dim, eps), RMSNorm(lead, head_dim, eps)


class QKVMixer(nn.Module):
    """What the q/k/v mixers (P, A, W, D, G) share: the projections (GQA; q/k/v biases with qkv_bias), the short
    convolution, QK-norm, RoPE (when `rope`) and the output projection."""

    def __init__(self, lead: tuple, lm: dict, rope: bool):
        super().__init__()
        D, Hq, H, d = lm["d_model"], lm["n_heads"], lm["n_kv_heads"], lm["head_dim"]
        self.Hq, self.H, self.d = Hq, H, d
        self.q_proj = Linear(lead, D, Hq * d, lm["qkv_bias"])
        self.k_proj = Linear(lead, D, H * d, lm["qkv_bias"])
        self.v_proj = Linear(lead, D, H * d, lm["qkv_bias"])
        self.o_proj = Linear(lead, Hq * d, D)
        self.conv = QKVConv(lead, Hq * d, H * d, lm["conv_size"]) if lm["conv_size"] else None
        self.qk_norm = QKNorm(lead, d, lm["norm_eps"]) if lm["qk_norm"] else None
        self.rope = rope and lm["rope_base"] is not None
        self.rope_fields = {k: lm[k] for k in lm if k.startswith("rope_")}  # computed on use: never a meta tensor

    def project(self, x: torch.Tensor, state: dict, position: torch.Tensor, live: torch.Tensor):
        """q [B, Hq, d], k and v [B, H, d] of one token x [B, D] (the conv's past updated in `state`)."""
        B = x.shape[0]
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.conv is not None:
            (q, k, v), state["conv"] = self.conv.step((q, k, v), state["conv"], live)
        q, k, v = q.view(B, self.Hq, self.d), k.view(B, self.H, self.d), v.view(B, self.H, self.d)
        if self.qk_norm is not None:
            q, k = self.qk_norm.q_norm(q), self.qk_norm.k_norm(k)
        if self.rope:
            inv_freq = rope_frequencies(self.d, self.rope_fields["rope_base"], self.rope_fields)
            q, k = apply_rope(q, position, inv_freq), apply_rope(k, position, inv_freq)
        return q, k, v

    def empty(self, batch: int, device) -> dict:
        """The state before the first token: the conv's past (the subclass adds its own)."""
        return {} if self.conv is None else {"conv": self.conv.empty(batch, device)}

    def grouped(self, q: torch.Tensor) -> torch.Tensor:
        """q [B, Hq, d] as [B, H, g, d]: query head h reads kv head h // g."""
        return q.view(q.shape[0], self.H, self.Hq // self.H, self.d)

    def out(self, y: torch.Tensor) -> torch.Tensor:
        """The output projection of heads [B, H, g, d] or [B, Hq, d]."""
        return self.o_proj(y.reshape(y.shape[0], self.Hq * self.d))


class Attention(QKVMixer):
    """Softmax attention (A), or over a sliding window of `window` tokens (W); its state every key and value so far
    (a reference cache: the window's keys are masked, not evicted) with their positions and whether each is real."""

    def __init__(self, lead: tuple, lm: dict, window: int | None):
        super().__init__(lead, lm, rope=True)
        self.window = window

    def empty(self, batch: int, device) -> dict:
        kv = torch.zeros(batch, self.H, 0, self.d, device=device)
        zeros = torch.zeros(batch, 0, device=device)
        return super().empty(batch, device) | dict(k=kv, v=kv, pos=zeros.long(), live=zeros.bool())

    def step(self, x, state, position, live):
        q, k, v = self.project(x, state, position, live)
        state["k"] = torch.cat([state["k"], k[:, :, None]], dim=2)
        state["v"] = torch.cat([state["v"], v[:, :, None]], dim=2)
        state["pos"] = torch.cat([state["pos"], position[:, None]], dim=1)
        state["live"] = torch.cat([state["live"], live[:, None]], dim=1)
        scores = torch.einsum("bhgd,bhld->bhgl", self.grouped(q) * self.d**-0.5, state["k"])
        seen = state["live"]
        if self.window is not None:
            seen = seen & (position[:, None] - state["pos"] < self.window)
        scores = scores.masked_fill(~seen[:, None, None, :], float("-inf"))
        return self.out(torch.einsum("bhgl,bhld->bhgd", scores.softmax(-1), state["v"]))


@cache
def _monomials(d: int, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The factors [D, p] of each monomial of degree p in d variables and sqrt of its multinomial coefficient [D]."""
    factors = list(combinations_with_replacement(range(d), p))
    weights = [math.factorial(p) / math.prod(math.factorial(f.count(i)) for i in set(f)) for f in factors]
    return torch.tensor(factors), torch.tensor(weights, dtype=torch.float64).sqrt().float()


class PowerRetention(QKVMixer):
    """Power retention (P): S_t = g_t S_{t-1} + phi(k_t) v_t^T, z_t = g_t z_{t-1} + phi(k_t), y_t = phi(q_t) S_t /
    phi(q_t) z_t, phi the symmetric power of degree p (phi(q).phi(k) = (q.k)^p), q scaled by d^-1/2, g_t =
    sigmoid(x W_g + b_g) per kv head with gating (else 1)."""

    def __init__(self, lead: tuple, lm: dict):
        super().__init__(lead, lm, rope=True)
        self.gate_proj = Linear(lead, lm["d_model"], self.H, bias=True) if lm["gating"] else None
        self.deg = lm["deg"]

    def phi(self, x: torch.Tensor) -> torch.Tensor:
        """phi(x) [..., D] of x [..., d]."""
        factors, weights = _monomials(self.d, self.deg)
        return x[..., factors.to(x.device)].prod(-1) * weights.to(x.device)

    def empty(self, batch: int, device) -> dict:
        D = math.comb(self.d + self.deg - 1, self.deg)
        S = torch.zeros(batch, self.H, D, self.d + 1, device=device)  # [S | z]
        return super().empty(batch, device) | dict(S=S)

    def run(self, h: torch.Tensor, state: dict, positions: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """y [B, T, D] of the call's T tokens h [B, T, D] continuing `state` (updated in place), as one chunk: each
        query reads the state carried in (decayed by its cumulative gate) and the call's keys directly, (q.k)^p
        with no cancellation across phi's features (as the op's chunked form and its oracle do), then the state
        takes the call's keys. A padded token decays nothing and is no key."""
        T = h.shape[1]
        q, k, v = (
            torch.stack(x, 1)
            for x in zip(*(self.project(h[:, t], state, positions[:, t], live[:, t]) for t in range(T)))
        )
        B = q.shape[0]
        q = q.view(B, T, self.H, self.Hq // self.H, self.d).permute(0, 2, 3, 1, 4) * self.d**-0.5  # [B, H, g, T, d]
        k, v = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)  # [B, H, T, d]
        v_aug = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        a = torch.zeros(B, self.H, T, device=h.device)
        if self.gate_proj is not None:
            a = F.logsigmoid(self.gate_proj(h)).permute(0, 2, 1)
        a = torch.where(live[:, None, :], a, torch.zeros_like(a))
        G = torch.cumsum(a, dim=-1)  # [B, H, T]
        visible = torch.tril(torch.ones(T, T, dtype=torch.bool, device=h.device)) & live[:, None, :]  # [B, T, T]
        decay = torch.where(visible[:, None], torch.exp(G[..., :, None] - G[..., None, :]), torch.zeros(()))
        weights = torch.einsum("bhgid,bhjd->bhgij", q, k) ** self.deg * decay[:, :, None]
        y = torch.einsum("bhgij,bhje->bhgie", weights, v_aug)
        y = y + torch.exp(G)[:, :, None, :, None] * torch.einsum("bhgtD,bhDe->bhgte", self.phi(q), state["S"])
        key_decay = torch.where(live[:, None, :], torch.exp(G[..., -1:] - G), torch.zeros(()))  # [B, H, T]
        write = torch.einsum("bhjD,bhje->bhDe", self.phi(k) * key_decay[..., None], v_aug)
        state["S"] = torch.exp(G[..., -1])[..., None, None] * state["S"] + write
        y = (y[..., :-1] / y[..., -1:]).permute(0, 3, 1, 2, 4)  # [B, T, H, g, d]
        return self.o_proj(y.reshape(B, T, self.Hq * self.d))


class MatrixState(QKVMixer):
    """What Gated DeltaNet and GLA share: a state S [B, H, d, d], the read o = d^-1/2 S^T q per query head, the
    output RMSNorm gated by SiLU(x W_gate), the output projection."""

    def __init__(self, lead: tuple, lm: dict):
        super().__init__(lead, lm, rope=False)
        self.gate_proj = Linear(lead, lm["d_model"], self.Hq * self.d)
        self.o_norm = RMSNorm(lead, self.d, OUTPUT_NORM_EPS)

    def empty(self, batch: int, device) -> dict:
        return super().empty(batch, device) | dict(S=torch.zeros(batch, self.H, self.d, self.d, device=device))

    def read(self, x: torch.Tensor, q: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
        o = torch.einsum("bhgd,bhde->bhge", self.grouped(q) * self.d**-0.5, S)
        gate = F.silu(self.gate_proj(x)).view(o.shape)
        return self.out(self.o_norm(o) * gate)


class GatedDeltaNet(MatrixState):
    """Gated DeltaNet (D): q, k L2-normalised after SiLU, v after SiLU; S_t = g_t (I - b_t k_t k_t^T) S_{t-1} +
    b_t k_t v_t^T with b = sigmoid(x W_beta), log g = -exp(A_log) softplus(x W_a + dt_bias) per kv head."""

    def __init__(self, lead: tuple, lm: dict):
        super().__init__(lead, lm)
        self.beta_proj = Linear(lead, lm["d_model"], self.H)
        self.a_proj = Linear(lead, lm["d_model"], self.H)
        self.dt_bias, self.A_log = Leaf(lead, self.H), Leaf(lead, self.H)

    def step(self, x, state, position, live):
        q, k, v = self.project(x, state, position, live)
        l2 = lambda t: t * torch.rsqrt(t.pow(2).sum(-1, keepdim=True) + L2_EPS)
        q, k, v = l2(F.silu(q)), l2(F.silu(k)), F.silu(v)
        beta = torch.sigmoid(self.beta_proj(x))
        log_g = -torch.exp(self.A_log.get()) * F.softplus(self.a_proj(x) + self.dt_bias.get())
        S = torch.exp(log_g)[..., None, None] * state["S"]
        error = v - torch.einsum("bhd,bhde->bhe", k, S)
        S = S + torch.einsum("bhd,bhe->bhde", k, beta[..., None] * error)
        state["S"] = keep(live, S, state["S"])
        return self.read(x, q, S)


class GLA(MatrixState):
    """Gated linear attention (G): S_t = diag(g_t) S_{t-1} + k_t v_t^T, log g_t = log_sigmoid(x W_1 W_2 + b) / 16 per
    key channel."""

    def __init__(self, lead: tuple, lm: dict, rank: int):
        super().__init__(lead, lm)
        self.decay_down = Linear(lead, lm["d_model"], rank)
        self.decay_up = Linear(lead, rank, self.H * self.d, bias=True)

    def step(self, x, state, position, live):
        q, k, v = self.project(x, state, position, live)
        log_g = F.logsigmoid(self.decay_up(self.decay_down(x))).view(-1, self.H, self.d) / GLA_GATE_NORMALISER
        S = torch.exp(log_g)[..., None] * state["S"] + torch.einsum("bhd,bhe->bhde", k, v)
        state["S"] = keep(live, S, state["S"])
        return self.read(x, q, S)


class Mamba2(nn.Module):
    """Mamba2 (M): in_proj to z, x, B, C, dt; the short convolution (with a bias) over x, B and C, then SiLU; S_t =
    exp(dt_t A) S_{t-1} + B_t (dt_t x_t)^T per head, y_t = S_t^T C_t + D x_t; RMSNorm(y * SiLU(z)) per group times
    norm_scale; out_proj."""

    def __init__(self, lead: tuple, lm: dict):
        super().__init__()
        D, P, N, G = lm["d_model"], lm["head_dim"], lm["ssm_state_size"], lm["ssm_groups"]
        self.d_inner = lm["ssm_expand"] * D
        self.H, self.P, self.N, self.G = self.d_inner // P, P, N, G
        self.in_proj = Linear(lead, D, 2 * self.d_inner + 2 * G * N + self.H)
        self.conv = QKVConv(lead, self.d_inner, G * N, lm["conv_size"]) if lm["conv_size"] else None
        self.conv_bias = Leaf(lead, self.d_inner + 2 * G * N) if lm["conv_size"] else None
        self.dt_bias, self.A_log, self.D = Leaf(lead, self.H), Leaf(lead, self.H), Leaf(lead, self.H)
        self.norm_scale = Leaf(lead, self.d_inner)
        self.out_proj = Linear(lead, self.d_inner, D)

    def empty(self, batch: int, device) -> dict:
        state = dict(S=torch.zeros(batch, self.H, self.N, self.P, device=device))
        return state if self.conv is None else state | {"conv": self.conv.empty(batch, device)}

    def step(self, x, state, position, live):
        B, H, P, G, N = x.shape[0], self.H, self.P, self.G, self.N
        bc = G * N
        z, xs, Bs, Cs, dt = self.in_proj(x).split([self.d_inner, self.d_inner, bc, bc, H], dim=-1)
        if self.conv is not None:
            (xs, Bs, Cs), state["conv"] = self.conv.step((xs, Bs, Cs), state["conv"], live)
            bias = self.conv_bias.get().split([self.d_inner, bc, bc])
            xs, Bs, Cs = xs + bias[0], Bs + bias[1], Cs + bias[2]
        xh = F.silu(xs).view(B, H, P)
        per_head = lambda m: F.silu(m).view(B, G, N).repeat_interleave(H // G, dim=1)  # head h: group h // (H/G)
        dt = F.softplus(dt + self.dt_bias.get())
        decay = torch.exp(-dt * torch.exp(self.A_log.get()))
        S = decay[..., None, None] * state["S"] + torch.einsum("bhn,bhp->bhnp", per_head(Bs), dt[..., None] * xh)
        state["S"] = keep(live, S, state["S"])
        y = torch.einsum("bhn,bhnp->bhp", per_head(Cs), S) + self.D.get()[:, None] * xh
        gated = (y.reshape(B, self.d_inner) * F.silu(z)).view(B, G, -1)
        y = rms_norm(gated, None, MAMBA2_NORM_EPS).reshape(B, self.d_inner) * self.norm_scale.get()
        return self.out_proj(y)


def build_mixer(lead: tuple, lm: dict, letter: str) -> nn.Module:
    """The mixer of a `letter` layer from its fields (`for_kind`)."""
    if letter in "AW":
        return Attention(lead, lm, lm["window"] if letter == "W" else None)
    if letter == "P":
        return PowerRetention(lead, lm)
    if letter == "D":
        return GatedDeltaNet(lead, lm)
    if letter == "G":
        return GLA(lead, lm, rank=16)
    if letter == "M":
        return Mamba2(lead, lm)
    raise ValueError(f"layer letter {letter!r} has no PyTorch form here (P, A, W, D, G and M do)")


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, lead: tuple, d_model: int, hidden: int):
        super().__init__()
        self.gate, self.up = Linear(lead, d_model, hidden), Linear(lead, d_model, hidden)
        self.down = Linear(lead, hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def mlp_hidden(lm: dict) -> int:
    """The SwiGLU width: mlp_width (0: none), or mlp_ratio * d_model rounded to a multiple of 8."""
    if lm.get("mlp_width") is not None:
        return lm["mlp_width"]
    return 8 * max(1, round(lm["mlp_ratio"] * lm["d_model"] / 8))


class Block(nn.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x)) (neither the MLP nor its norm when the width is 0)."""

    def __init__(self, lead: tuple, lm: dict, letter: str):
        super().__init__()
        D, eps, hidden = lm["d_model"], lm["norm_eps"], mlp_hidden(lm)
        self.mixer_norm = RMSNorm(lead, D, eps)
        self.mixer = build_mixer(lead, for_kind(lm, letter), letter)
        self.mlp_norm = RMSNorm(lead, D, eps) if hidden else None
        self.mlp = MLP(lead, D, hidden) if hidden else None

    def forward(self, x: torch.Tensor, state: dict, positions: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """x [B, T, D] through the block, the mixer token by token from `state` (updated in place)."""
        h = self.mixer_norm(x)
        if hasattr(self.mixer, "run"):
            y = self.mixer.run(h, state, positions, live)
        else:
            y = torch.stack(
                [self.mixer.step(h[:, t], state, positions[:, t], live[:, t]) for t in range(h.shape[1])], 1
            )
        x = x + torch.where(live[..., None], y, torch.zeros(()))  # a padded token's stream stays 0 (finite)
        return x if self.mlp is None else x + torch.where(live[..., None], self.mlp(self.mlp_norm(x)), torch.zeros(()))


class Periods(nn.Module):
    """scan_layers' stacked blocks: one Block per letter of the pattern, each Leaf [repeats, ...]."""

    def __init__(self, lm: dict, repeats: int):
        super().__init__()
        self.blocks = nn.ModuleList([Block((repeats,), lm, letter) for letter in lm["pattern"]])


class Embed(nn.Module):
    def __init__(self, vocab: int, d_model: int):
        super().__init__()
        self.embedding = Leaf((), vocab, d_model)


class RetentionCache:
    """The decode state of every layer (a dict per layer: the recurrent state, or A/W's keys and values, and the
    conv's past inputs), each row's next RoPE position and the tokens seen (padding included).

    Args:
        states: one dict per layer.
        position: [B] the next real token's position.
    """

    is_compileable = False

    def __init__(self, states: list, position: torch.Tensor):
        self.states, self.position, self.seen = states, position, 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The tokens this cache has seen (padding included), as transformers' caches count them."""
        return self.seen

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Keep the rows `beam_idx` (beam search)."""
        pick = lambda x: x.index_select(0, beam_idx.to(x.device))
        self.states = [
            {k: tuple(map(pick, v)) if isinstance(v, tuple) else pick(v) for k, v in s.items()} for s in self.states
        ]
        self.position = pick(self.position)


class RetentionForCausalLM(PreTrainedModel, GenerationMixin):
    """A retention export's LM in PyTorch (module docstring).

    Args:
        config: the export's RetentionConfig (its `retention_lm` the LMConfig).
    """

    config_class = RetentionConfig
    base_model_prefix = "retention"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _supports_cache_class = True

    def __init__(self, config: RetentionConfig):
        super().__init__(config)
        lm = config.retention_lm
        self.lm = lm
        self.kinds = "".join(lm["pattern"][i % len(lm["pattern"])] for i in range(lm["n_layers"]))
        self.embed = Embed(lm["vocab_size"], lm["d_model"])
        if lm.get("scan_layers"):
            self.periods = Periods(lm, lm["n_layers"] // len(lm["pattern"]))
        else:
            self.blocks = nn.ModuleList([Block((), lm, letter) for letter in self.kinds])
        self.final_norm = RMSNorm((), lm["d_model"], lm["norm_eps"])
        self.head = None if lm["tie_embeddings"] else Linear((), lm["d_model"], lm["vocab_size"])
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """No: the cache is this model's own RetentionCache, made by the first forward."""
        return False

    def _init_weights(self, module):
        """Nothing: every parameter comes from the export."""

    def get_input_embeddings(self):
        return None

    def get_output_embeddings(self):
        return None

    def layer(self, i: int) -> Block:
        """Layer i's block, its Leafs set to its repeat when the layers are scanned."""
        if not self.lm.get("scan_layers"):
            return self.blocks[i]
        period = len(self.lm["pattern"])
        block = self.periods.blocks[i % period]
        for module in block.modules():
            if isinstance(module, Leaf):
                module.index = i // period
        return block

    def empty_cache(self, batch: int, device) -> RetentionCache:
        """A cache before the first token."""
        states = [self.layer(i).mixer.empty(batch, device) for i in range(len(self.kinds))]
        return RetentionCache(states, torch.zeros(batch, dtype=torch.long, device=device))

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits of input_ids [B, T], continuing a RetentionCache (`cache` or `past_key_values`) when given.

        Args:
            input_ids: token ids [B, T].
            attention_mask: [B, T] of the new tokens, or [B, seen + T] (transformers' generate): 0 for padding.
            use_cache: return the cache (a new one when none was given).
            return_dict: unused (a CausalLMOutputWithPast always).
            **kwargs: `cache` or `past_key_values` (a RetentionCache, or an empty cache of transformers'); the rest
                (position_ids, ...) is ignored: positions come from the mask and the cache.

        Returns:
            CausalLMOutputWithPast: float32 logits [B, T, vocab_size] and the cache.
        """
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        B, T = input_ids.shape
        device = input_ids.device
        if not isinstance(cache, RetentionCache):
            if cache is not None and getattr(cache, "get_seq_length", lambda: 0)() > 0:
                raise ValueError(f"cache must be a RetentionCache of this model, got {type(cache).__name__}")
            cache = self.empty_cache(B, device)
        live = torch.ones(B, T, dtype=torch.bool, device=device)
        if attention_mask is not None:
            live = attention_mask[:, -T:].bool()
        positions = cache.position[:, None] + torch.cumsum(live.long(), dim=1) - live.long()
        x = torch.where(live[..., None], self.embed.embedding.get()[input_ids], torch.zeros(()))
        for i, state in enumerate(cache.states):
            x = self.layer(i)(x, state, positions, live)
        cache.position = cache.position + live.long().sum(1)
        cache.seen += T
        x = self.final_norm(x)
        logits = x @ self.embed.embedding.get().T if self.head is None else self.head(x)
        use_cache = getattr(self.config, "use_cache", True) if use_cache is None else use_cache
        return CausalLMOutputWithPast(logits=logits, **{CACHE_FIELD: cache if use_cache else None})

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, attention_mask=None, **kwargs) -> dict:
        """The next forward's inputs: the tokens the cache has not seen, the cache, the mask.

        Args:
            input_ids: every token so far [B, L].
            attention_mask: [B, L] or None.
            **kwargs: generate's (the cache as `cache` or `past_key_values`, use_cache, ...).

        Returns:
            The forward's keyword arguments.
        """
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        use_cache = kwargs.get("use_cache", True)
        if isinstance(cache, RetentionCache):
            input_ids = input_ids[:, cache.seen :]
        else:
            cache = None
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache)
        if use_cache and cache is not None:
            inputs[CACHE_FIELD] = cache
        return inputs
