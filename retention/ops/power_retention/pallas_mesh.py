"""The kernels' entries from the op under any mesh: `chunked_pallas` and `step_pallas` (pallas.py) inside a
shard_map over the batch and head axes of the ambient mesh (`retention/ops/kernel_mesh.py`), or as they are
without a mesh or inside one (the context-parallel op's shard_map). Each device runs the kernels on its own rows
and kv-heads with its own slice of the state; nothing is gathered."""

from functools import partial

from retention.ops.kernel_mesh import BATCH, HEADS, run_sharded, shard_plan
from retention.ops.power_retention.pallas import chunked_pallas, interpreted, step_pallas
from retention.ops.power_retention.state import RetentionState

TOKENS = (BATCH, None, HEADS, None)  # q, k, v [B, T, H, d]
GATES = (BATCH, None, HEADS)  # log_g [B, T, H]
STATE = RetentionState(S=(BATCH, HEADS, None, None), z=(BATCH, HEADS, None))


def chunked_on_mesh(q, k, v, log_g, state: RetentionState, *, deg: int, scale: float, chunk_size, segment_ids=None):
    """`chunked_pallas` (same arguments and result) split over the ambient mesh's batch and head axes."""
    run = partial(chunked_pallas, deg=deg, scale=scale, chunk_size=chunk_size)
    plan = shard_plan(q, k.shape[2])
    if plan is None:
        return run(q, k, v, log_g, state, segment_ids=segment_ids)
    local = lambda q, k, v, g, S, z, seg: run(q, k, v, g, RetentionState(S, z), segment_ids=seg)
    args = (q, k, v, log_g, state.S, state.z, segment_ids)
    roles = (TOKENS, TOKENS, TOKENS, GATES, STATE.S, STATE.z, (BATCH, None))
    return run_sharded(local, plan, args, roles, (TOKENS, STATE), check_vma=not interpreted("pallas"))


def step_on_mesh(state: RetentionState, q, k, v, log_g, *, deg: int, scale: float, segment_ids=None):
    """`step_pallas` (same arguments and result) split over the ambient mesh's batch and head axes."""
    run = partial(step_pallas, deg=deg, scale=scale)
    plan = shard_plan(q, k.shape[2])
    if plan is None:
        return run(state, q, k, v, log_g, segment_ids=segment_ids)
    local = lambda S, z, q, k, v, g, seg: run(RetentionState(S, z), q, k, v, g, segment_ids=seg)
    args = (state.S, state.z, q, k, v, log_g, segment_ids)
    roles = (STATE.S, STATE.z, TOKENS, TOKENS, TOKENS, GATES, (BATCH, None))
    return run_sharded(local, plan, args, roles, (TOKENS, STATE), check_vma=not interpreted("pallas"))
