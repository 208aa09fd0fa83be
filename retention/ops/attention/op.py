"""The public softmax-attention op and its dispatch: causal, full or over a sliding window.

impl = "auto" | "xla" | "cudnn" | "reference" | "splash":
- "xla": blockwise with an online softmax (`blockwise.py`), on every backend;
- "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")` (GPU only; cuDNN's flash attention takes bf16
  and fp16 only);
- "reference": dense (`reference.py`), O(T^2) memory;
- "splash": splash attention (`splash.py`), TPU; interpreted on CPU;
- "auto": splash on TPU; cuDNN on GPU for bf16/fp16 inputs, blockwise for float32 on GPU (the stated fallback: no
  float32 flash kernel in cuDNN); blockwise elsewhere. The platform is the default device's, or the target of an
  active `pallas_kernels.power_retention.lowering_for` (lowering from CPU for a GPU or TPU).

segment_ids [B, T] int (packed documents: a query sees only keys of its own segment) reach the splash path here;
the other paths take them with the packing change (until then they raise NotImplementedError).
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from pallas_kernels.power_retention import lowering_target
from retention.ops.attention.blockwise import blockwise_attention
from retention.ops.attention.reference import dense_attention
from retention.ops.attention.splash import splash_attention
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
    segment_ids: Int[Array, "B T"] | None = None,
) -> Float[Array, "B T Hq d"]:
    """Causal softmax attention; with `window`, query t sees keys t-window+1 .. t. Returns [B, T, Hq, d] in v's
    dtype. impl: one of ATTENTION_IMPLS (see the module docstring)."""
    check_qkv(q, k, v)
    check_scale(scale)
    check_window(window)
    check_choice("impl", impl, ATTENTION_IMPLS)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if segment_ids is not None and (
        segment_ids.shape != q.shape[:2] or not jnp.issubdtype(segment_ids.dtype, jnp.integer)
    ):
        raise ValueError(
            f"segment_ids must be integers of shape (B, T)={q.shape[:2]}, got {segment_ids.dtype}{segment_ids.shape}"
        )
    platform = lowering_target() or jax.default_backend()
    if impl == "splash" or (impl == "auto" and platform == "tpu"):
        return splash_attention(
            q, k, v, window=window, scale=scale, segment_ids=segment_ids, interpret=platform == "cpu"
        )
    if segment_ids is not None:
        raise NotImplementedError(f"segment_ids with impl={impl!r}: only impl='splash' (TPU) takes them here")
    if impl == "cudnn" or (impl == "auto" and platform == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)):
        local = None if window is None else (window - 1, 0)
        return jax.nn.dot_product_attention(
            q, k, v, scale=scale, is_causal=True, local_window_size=local, implementation="cudnn"
        )
    if impl == "reference":
        return dense_attention(q, k, v, window=window, scale=scale)
    return blockwise_attention(q, k, v, window=window, scale=scale)
