"""Export a run's trained parameters: `python -m retention.export RUN_DIR OUT [--step N]` writes OUT/model.safetensors
(one tensor per parameter, named by its key path) and OUT/config.json (the run's record: config, LMConfig,
parameter shapes; and the step). `retention.load_run(OUT)` reads it back, checked (retention/load.py).

Integrity, as a checkpoint has it: the weights file's metadata holds the step, the record's sha256 and a checksum
pair per tensor (retention/train/checksum.py); config.json holds the record, its sha256 and the step, so a
config.json of another run, a tensor with a flipped bit or either file cut short is refused on load. The folder
is written aside (a new folder beside OUT) and renamed into place: a reader finds the old export, the new one or
none, never a mix of two. OUT may not be a run folder (the run's checkpoints stay what load_run reads there), a
symbolic link, or a folder holding other files; nothing in it is followed or written through.
"""

import argparse
import json
import os
import shutil
import tempfile

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from retention.load import EXPORT_CONFIG, EXPORT_WEIGHTS, is_run_folder, read_run, weight_name
from retention.train.checksum import tree_checksums
from retention.train.record import record_digest

EXPORT_FILES = (EXPORT_WEIGHTS, EXPORT_CONFIG)


def check_out(run_dir: str, out: str) -> None:
    """ValueError when `out` may not receive an export of `run_dir`: a run folder (that one or another), a
    symbolic link, or a folder holding files other than an export's."""
    if os.path.islink(out):
        raise ValueError(f"out must not be a symbolic link, got {out!r} (-> {os.readlink(out)!r})")
    if os.path.abspath(out) == os.path.abspath(run_dir) or is_run_folder(out):
        raise ValueError(
            f"out must be a folder of its own, got {out!r}, a run folder: an export there would hide the run's "
            "checkpoints from load_run. Export to another folder (e.g. <run>/export)."
        )
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise ValueError(f"out must be a folder, got {out!r} (a file)")
        if others := sorted(set(os.listdir(out)) - set(EXPORT_FILES)):
            raise ValueError(f"out must be empty or an export folder, got {out!r} holding {others[:4]}")


def export_run(run_dir: str, out: str, step: int | None = None) -> str:
    """Write the parameters of `run_dir`'s checkpoint `step` (None: the newest intact one) to `out`, replacing an
    export there in one rename; returns out."""
    check_out(run_dir, out)
    loaded = read_run(run_dir, step)
    weights = {weight_name(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(nnx.state(loaded.model))}
    checksums, _ = tree_checksums(weights)
    digest = record_digest(loaded.record)
    metadata = {
        "format": "retention",
        "step": str(loaded.step),
        "record_sha256": digest,
        "checksums": json.dumps(checksums),
    }
    parent, name = os.path.split(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    aside = tempfile.mkdtemp(dir=parent, prefix=f".{name}.export-")  # new and empty: nothing in it is a link
    try:
        save_file(weights, os.path.join(aside, EXPORT_WEIGHTS), metadata=metadata)
        with open(os.path.join(aside, EXPORT_CONFIG), "x") as f:
            json.dump({"step": loaded.step, "record": loaded.record, "record_sha256": digest}, f, indent=2)
        os.chmod(aside, 0o755)  # mkdtemp makes it private
        if os.path.exists(out):  # the old export moves out of the way, then the new one moves in
            old = tempfile.mkdtemp(dir=parent, prefix=f".{name}.old-")
            os.rename(out, os.path.join(old, name))
            os.rename(aside, out)
            shutil.rmtree(old)
        else:
            os.rename(aside, out)
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a train.py run folder (hydra.run.dir)")
    parser.add_argument("out", help="a folder of its own to write model.safetensors and config.json to")
    parser.add_argument("--step", type=int, default=None, help="a checkpoint's step (default: the newest intact)")
    args = parser.parse_args()
    try:
        print(f"wrote {export_run(args.run_dir, args.out, args.step)}")
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
