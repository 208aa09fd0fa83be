"""Orbax checkpoints of the train state: every K steps and at the end, keep N, restore the newest good one.

A checkpoint is written to a temporary folder and renamed when complete, so a run killed mid-save leaves no
listed step (the temporary folder is removed on the next start). A listed checkpoint that cannot be read, or
holds a non-finite number, is skipped with a warning and the one before it is tried. A checkpoint written under
one device mesh restores under another (`restore_latest` with the new mesh's shardings).
"""

import logging
import os

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


def all_finite(tree) -> bool:
    """Whether every floating-point leaf of `tree` is free of NaN and inf."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)


class Checkpoints:
    """A CheckpointManager over `directory`: saves every `every` steps (and when forced), keeps `keep`."""

    def __init__(self, directory: str, *, every: int, keep: int):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=False,  # the train step donates the state it was given: copy it first
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self.every = every

    def save(self, step: int, state, *, force: bool = False) -> bool:
        """Save `state` as `step` when the interval says so (or `force`); refuses a state with NaN or inf."""
        if step in self.manager.all_steps() or not (force or step % self.every == 0):
            return False
        if not all_finite(state):
            raise FloatingPointError(f"refusing to checkpoint step {step}: the state holds NaN or inf")
        return self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

    def restore_latest(self, abstract_state, shardings=None):
        """(step, state) of the newest readable, finite checkpoint shaped like `abstract_state`, or None.

        With `shardings` (a tree of jax.sharding.Sharding like the state's) each array is restored straight into
        its sharding, whatever mesh the checkpoint was written under (Orbax reads each device's slices).
        """
        if shardings is not None:
            abstract_state = jax.tree.map(
                lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings
            )
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                state = self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
            except Exception as e:  # a damaged checkpoint raises whatever its reader hits: skip it
                log.warning(
                    "skipping checkpoint %d in %s: unreadable (%s: %s)",
                    step,
                    self.directory,
                    type(e).__name__,
                    str(e).splitlines()[0] if str(e) else "",
                )
                continue
            if not all_finite(state):
                log.warning("skipping checkpoint %d in %s: it holds NaN or inf", step, self.directory)
                continue
            return step, state
        return None

    def close(self) -> None:
        """Finish pending writes and release the manager."""
        self.manager.wait_until_finished()
        self.manager.close()
