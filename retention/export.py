"""Export a run's trained parameters: `python -m retention.export RUN_DIR OUT [--step N]` writes OUT/model.safetensors
(one tensor per parameter, named by its key path) and OUT/config.json (the run's record: config, LMConfig,
parameter shapes; and the step). `retention.load_run(OUT)` reads it back."""

import argparse
import json
import os

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from retention.run import EXPORT_CONFIG, EXPORT_WEIGHTS, read_run, weight_name


def export_run(run_dir: str, out: str, step: int | None = None) -> str:
    """Write the parameters of `run_dir`'s checkpoint `step` (None: the newest intact one) to `out`; returns out."""
    loaded = read_run(run_dir, step)
    params = nnx.state(loaded.model)
    weights = {weight_name(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params)}
    os.makedirs(out, exist_ok=True)
    save_file(weights, os.path.join(out, EXPORT_WEIGHTS), metadata={"format": "retention", "step": str(loaded.step)})
    with open(os.path.join(out, EXPORT_CONFIG), "w") as f:
        json.dump({"step": loaded.step, "record": loaded.record}, f, indent=2)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a train.py run folder (hydra.run.dir)")
    parser.add_argument("out", help="the folder to write model.safetensors and config.json to")
    parser.add_argument("--step", type=int, default=None, help="a checkpoint's step (default: the newest intact)")
    args = parser.parse_args()
    print(f"wrote {export_run(args.run_dir, args.out, args.step)}")


if __name__ == "__main__":
    main()
