"""Softmax attention on TPU through splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`): causal or
a sliding window, grouped-query heads, optional segment ids (packed documents attend only within themselves).

The sequence is padded at the end to a multiple of the block size (padded keys come after every real query, so the
causal mask hides them; each padded query sees itself) and cropped back. One MQA kernel per kv-head serves its g
query heads; it is vmapped over the batch and kv-heads. Under a mesh the call runs inside a shard_map over the batch
and head axes (`retention/ops/kernel_mesh.py`), as a Mosaic kernel must; with check_vma=False, since splash's
outputs carry no varying-axes type (each device's output is its own block, as the out_specs say). With
`jax_enable_x64` on, splash's backward fails Mosaic verification on TPU (JAX 0.11.2: 64-bit index arithmetic);
the tests lower it with x64 off, as programs run.
"""

import jax
import jax.numpy as jnp
from einops import rearrange
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from retention.ops.kernel_mesh import BATCH, HEADS, run_sharded, shard_plan

BLOCK = 128  # splash's default block sizes (query and key blocks, forward and backward)


def _local_splash(q, k, v, segment_ids, *, window: int | None, scale: float, interpret: bool):
    """splash on one device's arrays: q [B, T, Hq, d], k, v [B, T, H, d], segment_ids [B, T] int or None."""
    B, T, Hq, d = q.shape
    H = k.shape[2]
    n = -(-T // BLOCK) * BLOCK
    pad = [(0, 0), (0, n - T), (0, 0), (0, 0)]
    q_BHgTd = rearrange(jnp.pad(q * jnp.asarray(scale, q.dtype), pad), "B T (H g) d -> B H g T d", H=H)
    k_BHTd, v_BHTd = (rearrange(jnp.pad(x, pad), "B T H d -> B H T d") for x in (k, v))
    ids = None if segment_ids is None else jnp.pad(segment_ids.astype(jnp.int32), [(0, 0), (0, n - T)], mode="edge")
    return _splash_heads(q_BHgTd, k_BHTd, v_BHTd, ids, window, interpret)[:, :T].astype(v.dtype)


def _splash_heads(q_BHgTd, k_BHTd, v_BHTd, ids, window, interpret):
    """The splash kernel vmapped over batch and kv-heads on padded arrays; returns [B, n, Hq, d]."""
    n, g = k_BHTd.shape[2], q_BHgTd.shape[2]
    causal = splash.CausalMask((n, n)) if window is None else splash.LocalMask((n, n), (window - 1, 0), offset=0)
    kernel = splash.make_splash_mqa_single_device(
        splash.MultiHeadMask([causal] * g), block_sizes=splash.BlockSizes.get_default(), interpret=interpret
    )
    if ids is None:
        out = jax.vmap(jax.vmap(lambda q, k, v: kernel(q, k, v)))(q_BHgTd, k_BHTd, v_BHTd)
    else:
        per_head = lambda q, k, v, ids: kernel(q, k, v, segment_ids=splash.SegmentIds(q=ids, kv=ids))
        out = jax.vmap(jax.vmap(per_head, in_axes=(0, 0, 0, None)))(q_BHgTd, k_BHTd, v_BHTd, ids)
    return rearrange(out, "B H g n d -> B n (H g) d")


def splash_attention(q, k, v, *, window: int | None, scale: float, segment_ids=None, interpret: bool = False):
    """Causal softmax attention (within `window` tokens when given; within each segment when segment_ids [B, T] is
    given) on splash attention: [B, T, Hq, d] in v's dtype. Inputs validated by the op; `interpret` runs the kernel
    in Pallas interpret mode (CPU)."""

    def run(q, k, v, segment_ids):
        return _local_splash(q, k, v, segment_ids, window=window, scale=scale, interpret=interpret)

    plan = shard_plan(q, k.shape[2])
    if plan is None:
        return run(q, k, v, segment_ids)
    tokens = (BATCH, None, HEADS, None)
    roles = (tokens, tokens, tokens, (BATCH, None))
    return run_sharded(run, plan, (q, k, v, segment_ids), roles, tokens, check_vma=False)
