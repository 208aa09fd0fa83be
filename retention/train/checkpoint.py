"""Orbax checkpoints of the train state, which never lose a result: saved asynchronously on Orbax's save policy
(every K steps, and at JAX's preemption sync point), keep N, restore the newest good one.

Each checkpoint `<dir>/<step>/state` carries in its Orbax metadata the run's record (config and parameter
shapes, with its sha256), a checksum pair per array (retention/checksum.py) and the run's progress
(first loss, last loss, tokens/s). On restore every array is checked against its checksum; a checkpoint that
cannot be read, fails a checksum or holds NaN or inf is moved aside to `<dir>_damaged/<step>_<time>` (never
deleted) with a warning, and the one before it is tried. A checkpoint written under one device mesh restores
under another (`restore_latest` with the new mesh's shardings). A save cut short is never listed (Orbax writes
to a temporary folder and renames it when complete; leftovers are removed on the next start).

Async saving copies every array to the host before `save` returns (Orbax's default, synchronous device-to-host
transfer), so the next train step may donate the state's buffers while the files are written.
"""

import contextlib
import logging
import os
import shutil
import time
from typing import NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import SingleDeviceSharding
from orbax.checkpoint import checkpoint_managers as policies

from retention.checksum import mismatched, tree_checksums
from retention.train.record import RunMismatch, record_digest

log = logging.getLogger(__name__)
ITEM = "state"


class SaveFailed(OSError):
    """A checkpoint could not be written (a read-only folder, a full disk): the run stops."""


class Restored(NamedTuple):
    step: int
    state: dict
    record: dict  # the run record the checkpoint was written with
    progress: dict  # initial_loss, train_loss, tokens_per_s as of that step


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _damage(bad: list[str], finite: bool) -> str | None:
    """What is wrong with restored arrays, from `checksum.mismatched`, or None."""
    if bad:
        return f"{len(bad)} arrays differ from their checksums ({bad[0]} first)"
    return None if finite else "it holds NaN or inf"


def _all_processes(flag: bool) -> bool:
    """`flag` and-ed over every process (a multi-process job agrees on a checkpoint's fate)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.all(multihost_utils.process_allgather(np.int32(flag))))


class Checkpoints:
    """A CheckpointManager over `directory`: saves every `every` steps or at a preemption sync point (and when the
    loop forces it), keeps the newest `keep`; `record` is the run record each checkpoint is written with."""

    def __init__(
        self, directory: str, *, every: int = 1, keep: int = 1, record: dict | None = None, read_only: bool = False
    ):
        """read_only: only restore (nothing created or cleaned up: safe beside a run that is saving)."""
        self.directory = os.path.abspath(directory)
        self.record = record
        options = ocp.CheckpointManagerOptions(
            read_only=read_only,
            create=not read_only,
            cleanup_tmp_directories=not read_only,
            enable_async_checkpointing=True,
            # the step's folder is made in `save`, so a folder that cannot be written raises there; made in the
            # background, its writers would wait for it until Orbax's 300 s timeout, holding the process open
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
            save_decision_policy=policies.AnySavePolicy(
                [policies.FixedIntervalPolicy(every), policies.PreemptionCheckpointingPolicy()]
            ),
            preservation_policy=policies.LatestN(keep),
        )
        # a named item with its handler: the manager never guesses the layout from what it finds on disk (a damaged
        # folder would otherwise switch it to another layout and fail every later restore)
        handlers = {ITEM: ocp.PyTreeCheckpointHandler()}
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

    def steps(self) -> list[int]:
        """The listed checkpoint steps, oldest first."""
        return sorted(self.manager.all_steps())

    def reached_preemption(self, step: int) -> bool:
        """Whether every process has reached the step JAX's preemption sync point chose (False on one process)."""
        return self.manager.reached_preemption(step)

    def should_save(self, step: int) -> bool:
        """Orbax's decision for `step`: a multiple of `every` or the preemption sync point, and newer than the last."""
        return self.manager.should_save(step)

    def save(self, step: int, state, *, progress: dict) -> None:
        """Save `state` as `step` (asynchronously); refuses a state with NaN or inf (FloatingPointError)."""
        checksums, finite = tree_checksums(state)
        if not finite:
            raise FloatingPointError(f"refusing to checkpoint step {step}: the state holds NaN or inf")
        metadata = {
            "record": self.record,
            "record_sha256": record_digest(self.record),
            "checksums": checksums,
            "progress": progress,
        }
        args = ocp.args.Composite(**{ITEM: ocp.args.PyTreeSave(state)})
        try:  # raises too when the previous save's background writes failed
            self.manager.save(step, args=args, custom_metadata=metadata, force=True)
        except Exception as e:
            raise self._failed(f"could not save checkpoint {step}", e) from e

    def _failed(self, what: str, e: Exception) -> SaveFailed:
        """The SaveFailed error saying `what` failed in this folder, why, and the newest checkpoint kept."""
        kept = self.steps()
        newest = f"the newest checkpoint kept is step {kept[-1]}" if kept else "no checkpoint is kept"
        return SaveFailed(f"{what} in {self.directory}: {_first_line(e)}; the run stops ({newest})")

    def wait(self) -> None:
        """Wait for the pending save; SaveFailed when it failed."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            raise self._failed("could not finish writing a checkpoint", e) from e

    def metadata(self, step: int) -> dict:
        """The checkpoint's metadata, its record verified against its digest (ValueError when damaged)."""
        meta = self.manager.metadata(step).custom_metadata or {}
        if not {"record", "record_sha256", "checksums"} <= meta.keys():
            raise ValueError("its metadata has no run record or checksums")
        if record_digest(meta["record"]) != meta["record_sha256"]:
            raise ValueError("its run record does not match its sha256")
        return meta

    def restore_latest(self, abstract_state, shardings=None, *, check_record=None) -> Restored | None:
        """The newest checkpoint that reads back whole (every checksum equal, finite), or None; damaged ones are
        moved aside. `check_record(record, where)` may refuse a checkpoint of another run (RunMismatch, raised).

        With `shardings` (a tree of jax.sharding.Sharding like the state's) each array is restored straight into
        its sharding, whatever mesh the checkpoint was written under (Orbax reads each device's slices).
        """
        if shardings is None:
            shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), abstract_state)
        abstract_state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings
        )
        for step in reversed(self.steps()):
            try:
                meta = self.metadata(step)
                if check_record is not None:
                    check_record(meta["record"], f"checkpoint {step} in {self.directory}")
                state = self._restore(step, abstract_state)
                problem = _damage(*mismatched(meta["checksums"], state))
            except RunMismatch:
                raise
            except Exception as e:  # a damaged checkpoint raises whatever its reader hits
                problem = f"unreadable ({_first_line(e)})"
            if _all_processes(problem is None):
                return Restored(step, state, meta["record"], meta.get("progress", {}))
            self.set_aside(step, problem or "damaged on another process")
        return None

    def _restore(self, step: int, abstract, *, partial: bool = False):
        """The arrays of checkpoint `step` shaped and placed like `abstract` (ShapeDtypeStructs with shardings);
        partial: `abstract` names only some of them."""
        restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
        args = ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args, partial_restore=partial)
        return self.manager.restore(step, args=ocp.args.Composite(**{ITEM: args}))[ITEM]

    def restore_params(self, step: int, abstract_params):
        """The parameters alone (no optimizer state) of checkpoint `step`, restored into the shardings of
        `abstract_params` (jax.ShapeDtypeStructs) and checked against their checksums (ValueError when damaged)."""
        checksums = {k: v for k, v in self.metadata(step)["checksums"].items() if k.startswith("['params']")}
        if not checksums:
            raise ValueError(f"checkpoint {step} in {self.directory} has no checksums of its parameters")
        restored = self._restore(step, {"params": abstract_params}, partial=True)
        if problem := _damage(*mismatched(checksums, restored)):
            raise ValueError(f"checkpoint {step} in {self.directory} is damaged: {problem}")
        return restored["params"]

    def set_aside(self, step: int, reason: str) -> None:
        """Move checkpoint `step` to `<dir>_damaged/` (process 0 moves; every process forgets it)."""
        target = os.path.join(f"{self.directory}_damaged", f"{step}_{time.strftime('%Y%m%d-%H%M%S')}")
        if jax.process_index() == 0:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(os.path.join(self.directory, str(step)), target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"checkpoint {step} set aside")
        self.manager.reload()
        log.warning("checkpoint %d in %s is damaged: %s; moved it to %s", step, self.directory, reason, target)

    def close(self) -> None:
        """Finish pending writes and release the manager; SaveFailed when a pending save failed (the manager is
        released all the same)."""
        try:
            self.wait()
        except SaveFailed:
            with contextlib.suppress(Exception):  # its error is the one raised
                self.manager.close()
            raise
        self.manager.close()
