"""The scale preset's memory per device: experiment=scale_125m (model=hybrid_125m, about 125M parameters, at 16k
context, 32 sequences per step) compiled as the trainer's sharded train step under 8-device meshes of data x fsdp
(1x8 and 2x4: the parameters and AdamW moments FSDP-sharded, the batch split over both axes), and each compiled
step's per-device bytes from `compiled.memory_analysis()` against an H200.

A program cannot be compiled for a GPU without one, so the step is compiled for 8 fake CPU devices from shapes
alone (nothing is allocated): the numbers are XLA's CPU memory analysis of the sharded program, an estimate of the
GPU's (the GPU compiler assigns buffers its own way, and there the Pallas kernels replace the XLA chunked path of
the P layers). The bar is the memory JAX takes on an H200 by default: 75% (XLA_PYTHON_CLIENT_MEM_FRACTION) of the
139 GiB the device reports. The script re-executes itself with XLA_FLAGS=--xla_force_host_platform_device_count=8
when it starts with fewer devices.

    python -m experiments.scale_memory [--meshes 1x8 2x4] [--override key=value ...] [--out results/scale_memory.json]
"""

import argparse
import json
import os
import pathlib
import sys

import jax
import numpy as np

from experiments.compare.models import compose_config
from experiments.compare.speed import abstract_train_step
from retention.nn.sizing import cache_bytes, count_params
from retention.parallel import check_batch, make_mesh, state_shardings
from retention.train.config import make_lm_config

N_DEVICES = 8
DEVICE_FLAG = f"--xla_force_host_platform_device_count={N_DEVICES}"
H200_BYTES = 139 * 2**30  # what the device reports (about 141 GB)
JAX_DEFAULT_FRACTION = 0.75  # XLA_PYTHON_CLIENT_MEM_FRACTION's default: the share JAX preallocates
BAR_BYTES = int(JAX_DEFAULT_FRACTION * H200_BYTES)
EXPERIMENT = "experiment=scale_125m"


def step_bytes(memory) -> int:
    """A compiled step's bytes on one device from its memory analysis: arguments, outputs and temporaries (an upper
    bound: the donated state's outputs reuse the arguments' buffers, alias_size_in_bytes of them)."""
    return memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes


def parse_mesh(text: str) -> tuple[int, int]:
    """'DATAxFSDP' (e.g. '2x4') -> (data, fsdp), whose product must be the 8 devices."""
    parts = text.split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a mesh is DATAxFSDP of positive ints, e.g. 2x4, got {text!r}")
    data, fsdp = map(int, parts)
    if data * fsdp != N_DEVICES:
        raise argparse.ArgumentTypeError(f"a mesh must hold the {N_DEVICES} devices (data * fsdp), got {text!r}")
    return data, fsdp


def per_device_bytes(abstract_tree, shardings) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs placed by `shardings` (a NamedSharding per leaf)."""
    leaves = zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings))
    return sum(int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize for x, s in leaves)


def measure(cfg, data: int, fsdp: int) -> dict:
    """The sharded train step of `cfg` compiled under a (data, fsdp, 1) mesh: one device's argument, output, temp
    and alias bytes (XLA's memory analysis), its share of the state, and whether it fits under BAR_BYTES."""
    mesh = make_mesh(data, fsdp, 1)
    check_batch(cfg.data.batch_size, cfg.data.seq_len, mesh)
    _, _, state, compiled = abstract_train_step(
        cfg, cfg.data.seq_len, cfg.data.batch_size, vocab_size=cfg.data.vocab_size, mesh=mesh
    )
    memory = compiled.memory_analysis()
    total = step_bytes(memory)
    return {
        "mesh": {"data": data, "fsdp": fsdp, "sequence": 1},
        "state_bytes": cache_bytes(state),
        "state_bytes_per_device": per_device_bytes(state, state_shardings(state, mesh)),
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "alias_bytes": memory.alias_size_in_bytes,
        "temp_bytes": memory.temp_size_in_bytes,
        "total_bytes": total,
        "share_of_h200": total / H200_BYTES,
        "fits": total < BAR_BYTES,
    }


def scale_memory(meshes, overrides=()) -> dict:
    """The preset's config, parameter count and each mesh's `measure` (8 devices must be present)."""
    if jax.device_count() != N_DEVICES:
        raise RuntimeError(f"needs {N_DEVICES} devices (XLA_FLAGS={DEVICE_FLAG}), got {jax.device_count()}")
    cfg = compose_config([EXPERIMENT, *overrides])
    lm = make_lm_config(cfg.model, cfg.data.vocab_size)
    return {
        "what": "XLA's CPU memory analysis of the sharded train step on 8 fake devices: an estimate of the GPU's",
        "overrides": [EXPERIMENT, *overrides],
        "model": cfg.model.name,
        "layer_kinds": lm.layer_kinds,
        "params": count_params(lm),
        "d_model": lm.d_model,
        "vocab_size": lm.vocab_size,
        "seq_len": cfg.data.seq_len,
        "batch_size": cfg.data.batch_size,
        "dtype": lm.dtype,
        "scan_layers": lm.scan_layers,
        "remat_policy": lm.remat_policy,
        "h200_bytes": H200_BYTES,
        "bar_bytes": BAR_BYTES,
        "meshes": {f"{d}x{f}": measure(cfg, d, f) for d, f in meshes},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", type=parse_mesh, nargs="+", default=[(1, 8), (2, 4)], help="DATAxFSDP")
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides on top of the experiment")
    parser.add_argument("--out", default="results/scale_memory.json")
    args = parser.parse_args()
    if DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):  # JAX reads the device count once, at start-up
        flags = f"{os.environ.get('XLA_FLAGS', '')} {DEVICE_FLAG}".strip()
        env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
        os.execve(sys.executable, [sys.executable, "-m", "experiments.scale_memory", *sys.argv[1:]], env)
    result = scale_memory(args.meshes, args.override)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for name, m in result["meshes"].items():
        gib = m["total_bytes"] / 2**30
        print(f"{name}: {gib:.1f} GiB per device ({m['share_of_h200']:.0%} of an H200), fits: {m['fits']}")
    print(f"{result['params']:,} parameters; wrote {out}")


if __name__ == "__main__":
    main()
