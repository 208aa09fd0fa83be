"""RoPE's frequencies: base^(-2i/d) for i < d/2, optionally rescaled for a longer context as Hugging Face's rope
types "linear" (every frequency divided by a factor) and "llama3" (Llama 3.1's: the long wavelengths divided by
the factor, the short ones kept, a smooth blend between), computed as transformers computes them."""

import dataclasses
import math

import jax.numpy as jnp
from jaxtyping import Array, Float

from retention.validation import check_choice, check_int, check_number

ROPE_SCALINGS = ("none", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """A RoPE frequency scaling: `kind` "linear" (uses factor) or "llama3" (all four fields)."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 8192


def check_rope_scaling(kind, factor, low_freq_factor, high_freq_factor, original_max_len, *, names) -> None:
    """kind one of ROPE_SCALINGS; for "linear" and "llama3" a factor >= 1; for "llama3" 0 < low_freq_factor <
    high_freq_factor and original_max_len a positive int. `names`: the five fields' names for the messages."""
    check_choice(names[0], kind, ROPE_SCALINGS)
    if kind == "none":
        return
    check_number(names[1], factor, low=1)
    if kind == "llama3":
        check_number(names[2], low_freq_factor, low=0, open_low=True)
        check_number(names[3], high_freq_factor, low=0, open_low=True)
        if not low_freq_factor < high_freq_factor:
            raise ValueError(
                f"{names[2]} must be below {names[3]} (llama3 RoPE scaling), got {low_freq_factor} and "
                f"{high_freq_factor}"
            )
        check_int(names[4], original_max_len)


def rope_frequencies(head_dim: int, base: float, scaling: RopeScaling | None = None) -> Float[Array, " half"]:
    """The [head_dim / 2] float32 angular frequencies of RoPE: base^(-2i/head_dim), then `scaling`'s rescaling
    (None: none)."""
    half = head_dim // 2
    inv_freq = base ** (-2.0 * jnp.arange(half, dtype=jnp.float32) / head_dim)
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    low_wavelen = scaling.original_max_len / scaling.low_freq_factor
    high_wavelen = scaling.original_max_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, blended, scaled)
