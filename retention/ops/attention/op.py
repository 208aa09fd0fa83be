"""The public softmax-attention op and its dispatch: causal, full or over a sliding window.

impl = "auto" | "xla" | "cudnn" | "reference":
- "xla": blockwise with an online softmax (`blockwise.py`), on every backend;
- "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")` (GPU only);
- "reference": dense (`reference.py`), O(T^2) memory;
- "auto": cuDNN on GPU for bf16/fp16 inputs, else blockwise.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from retention.ops.attention.blockwise import blockwise_attention
from retention.ops.attention.reference import dense_attention
from retention.ops.attention.validation import ATTENTION_IMPLS, check_window
from retention.ops.validation import check_qkv, check_scale
from retention.validation import check_choice


def softmax_attention(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    *,
    window: int | None = None,
    scale: float | None = None,
    impl: str = "auto",
) -> Float[Array, "B T Hq d"]:
    """Causal softmax attention; with `window`, query t sees keys t-window+1 .. t. Returns [B, T, Hq, d] in v's
    dtype. impl: one of ATTENTION_IMPLS (see the module docstring)."""
    check_qkv(q, k, v)
    check_scale(scale)
    check_window(window)
    check_choice("impl", impl, ATTENTION_IMPLS)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    on_gpu = jax.default_backend() == "gpu"
    if impl == "cudnn" or (impl == "auto" and on_gpu and q.dtype in (jnp.bfloat16, jnp.float16)):
        local = None if window is None else (window - 1, 0)
        return jax.nn.dot_product_attention(
            q, k, v, scale=scale, is_causal=True, local_window_size=local, implementation="cudnn"
        )
    if impl == "reference":
        return dense_attention(q, k, v, window=window, scale=scale)
    return blockwise_attention(q, k, v, window=window, scale=scale)
