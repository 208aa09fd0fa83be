"""The public softmax-attention op and its dispatch: causal, full or over a sliding window, optionally packed
(segment_ids: no attention across documents).

impl = "auto" | "xla" | "cudnn" | "reference" | "splash":
- "xla": blockwise with an online softmax (`blockwise.py`), on every backend;
- "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")` (GPU only; cuDNN's flash attention takes bf16
  and fp16 only). That public API takes no segment ids: with segment_ids it gets a dense boolean [B, 1, T, T]
  mask, which cuDNN turns into a bias (O(T^2) memory; cuDNN's packed-segment form is only in JAX's private
  `jax._src.cudnn`);
- "reference": dense (`reference.py`), O(T^2) memory;
- "splash": splash attention (`splash.py`), TPU; interpreted on CPU;
- "auto": splash on TPU; cuDNN on GPU for bf16/fp16 inputs without segment_ids, blockwise for float32 on GPU (the
  stated fallback: no float32 flash kernel in cuDNN); blockwise elsewhere. The platform is
  `retention.ops.platform.target_platform()`: the default device's, or the target of an active `lowering_for`
  (lowering from CPU for a GPU or TPU).
A NaN or inf in an input gives NaN in the rows that see it, never anything finite (`scores.poison_nonfinite`);
`debug_checks=True` raises instead (a host callback, also under jit).
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from retention.ops.attention.blockwise import blockwise_attention
from retention.ops.attention.reference import dense_attention
from retention.ops.attention.scores import poison_nonfinite
from retention.ops.attention.splash import splash_attention
from retention.ops.attention.validation import ATTENTION_IMPLS, check_window
from retention.ops.platform import target_platform
from retention.ops.segments import document_index
from retention.ops.validation import check_qkv, check_scale, check_segment_ids, runtime_input_checks
from retention.validation import check_at_runtime, check_choice


def _cudnn(q, k, v, *, window, segment_ids, scale, implementation="cudnn"):
    """jax.nn.dot_product_attention, causal (and window), with segment_ids as a dense [B, 1, T, T] mask."""
    q, k, v = poison_nonfinite(q, k, v)
    local = None if window is None else (window - 1, 0)
    mask = None if segment_ids is None else (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    return jax.nn.dot_product_attention(
        q, k, v, mask=mask, scale=scale, is_causal=True, local_window_size=local, implementation=implementation
    )


@jax.named_scope("softmax_attention")
def softmax_attention(
    q: Float[Array, "B T Hq d"],
    k: Float[Array, "B T H d"],
    v: Float[Array, "B T H d"],
    *,
    window: int | None = None,
    segment_ids: Int[Array, "B T"] | None = None,
    scale: float | None = None,
    impl: str = "auto",
    debug_checks: bool = False,
) -> Float[Array, "B T Hq d"]:
    """Causal softmax attention, full or over a sliding window, optionally packed.

    Args:
        q: queries [B, T, Hq, d]; query head i reads kv-head i // (Hq // H).
        k: keys [B, T, H, d].
        v: values [B, T, H, d].
        window: query t sees keys t - window + 1 .. t; None: every earlier key.
        segment_ids: int [B, T]: equal ids form one document, contiguous in time (a change of id starts a fresh
            one); a query sees only keys of its own document. None: one document per row.
        scale: None is d^-0.5.
        impl: one of ATTENTION_IMPLS (see the module docstring).
        debug_checks: raise ValueError for non-finite q, k, v and non-contiguous documents.

    Returns:
        y [B, T, Hq, d] in v's dtype.
    """
    check_qkv(q, k, v)
    check_scale(scale)
    check_window(window)
    check_segment_ids(segment_ids, *q.shape[:2])
    check_choice("impl", impl, ATTENTION_IMPLS)
    if debug_checks:
        check_at_runtime(runtime_input_checks({"q": q, "k": k, "v": v}, segment_ids))
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if segment_ids is not None:  # documents by number: an id that comes back (under jit) starts a new one
        segment_ids = document_index(segment_ids)
    platform = target_platform()
    if impl == "splash" or (impl == "auto" and platform == "tpu"):
        q, k, v = poison_nonfinite(q, k, v)
        return splash_attention(
            q, k, v, window=window, scale=scale, segment_ids=segment_ids, interpret=platform == "cpu"
        )
    fast_dtype = q.dtype in (jnp.bfloat16, jnp.float16)
    if impl == "cudnn" or (impl == "auto" and platform == "gpu" and fast_dtype and segment_ids is None):
        return _cudnn(q, k, v, window=window, segment_ids=segment_ids, scale=scale)
    if impl == "reference":
        return dense_attention(q, k, v, window=window, segment_ids=segment_ids, scale=scale)
    return blockwise_attention(q, k, v, window=window, segment_ids=segment_ids, scale=scale)
