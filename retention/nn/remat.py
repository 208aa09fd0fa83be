"""Rematerialisation of the LM's blocks: the named policies of `LMConfig.remat_policy` and the per-block wrapper.

Each block runs under `nnx.remat` with the policy's `jax.checkpoint` policy (scanned or not):
- "none": no remat; the backward pass keeps every activation the autodiff saves.
- "full": nothing of the block is kept; its forward runs again in the backward pass.
- "save_projections": the mixer's q, k, v and output projections (named by `jax.checkpoint_name` in qkv.py) are
  kept, the rest recomputed.
- "offload": the same names are moved to the host's pinned memory and back (GPU and TPU only).
"""

import jax
from flax import nnx

from retention.ops.platform import target_platform
from retention.validation import check_choice

REMAT_POLICIES = ("none", "full", "save_projections", "offload")
PROJECTION_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj")
OFFLOAD_PLATFORMS = ("gpu", "tpu")


def check_remat_policy(policy) -> None:
    """`policy` must be one of REMAT_POLICIES (ValueError naming remat_policy otherwise)."""
    check_choice("remat_policy", policy, REMAT_POLICIES)


def checkpoint_policy(policy: str):
    """The `jax.checkpoint` policy of a remat_policy other than "none" (None for "full": save nothing). "offload"
    raises ValueError on a platform without pinned host memory (the target platform, see ops/platform.py)."""
    check_remat_policy(policy)
    if policy == "full":
        return None
    if policy == "save_projections":
        return jax.checkpoint_policies.save_only_these_names(*PROJECTION_NAMES)
    platform = target_platform()
    if policy == "offload" and platform not in OFFLOAD_PLATFORMS:
        raise ValueError(
            f"remat_policy='offload' needs a platform with pinned host memory {OFFLOAD_PLATFORMS}, this one is "
            f"{platform!r}; use one of {tuple(p for p in REMAT_POLICIES if p != 'offload')} here"
        )
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=(),
        names_which_can_be_offloaded=PROJECTION_NAMES,
        offload_src="device",
        offload_dst="pinned_host",
    )


def block_runner(policy: str, *, scanned: bool):
    """`run(block, x, positions, segment_ids, cache, mode) -> (x, cache)`: one block's call under `nnx.remat`
    with the policy (a plain call for "none"). Inside a scan common subexpressions need no protection (JAX's advice
    for remat in a loop body), so prevent_cse is off there."""

    def run(block, x_BTD, positions, segment_ids, cache, mode: str):
        return block(x_BTD, positions=positions, segment_ids=segment_ids, cache=cache, mode=mode)

    if policy == "none":
        return run
    return nnx.remat(run, policy=checkpoint_policy(policy), prevent_cse=not scanned, static_argnums=(5,))
