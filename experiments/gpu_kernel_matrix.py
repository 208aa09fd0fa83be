"""Which block sizes of the power-retention Triton kernels compile and run on this device, and how close each is to
the XLA chunked path: for each input dtype (float32 with exact matmuls, bf16) and each candidate (chunk, warps,
stages), value and gradient at T=1024 (B=1, H=8, d=64, gated) against `power_retention(impl="xla")`, the error of
each that fails to compile (Triton's shared-memory limit, say) recorded as it is; then forward+backward at 64k
(bf16) for the ones that pass. Made after the first H200 run, where the committed defaults did not compile.

    python -m experiments.gpu_kernel_matrix --out $OUT/kernel_matrix.json
"""

import argparse
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp

import pallas_kernels.power_retention as kernels
from experiments.gpu_check import inputs, kernel_op, rel_errs, state_and_grads, train_times, xla_op

START = time.perf_counter()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT") or "results", "kernel_matrix.json"))
    parser.add_argument("--T", type=int, default=1024)
    parser.add_argument("--long", type=int, default=65536, help="the length of the timed fwd+bwd (bf16)")
    args = parser.parse_args(argv)
    H, d = 8, 64
    base = kernels.candidate_block_sizes("gpu", d)[0]
    grid = [
        dataclasses.replace(base, chunk=c, num_warps=w, num_stages=s) for c in (64, 128) for w, s in ((4, 1), (8, 2))
    ]
    rows = []
    for dtype, precision in ((jnp.bfloat16, "default"), (jnp.float32, "highest")):
        qkvg = inputs(0, 1, args.T, H, d, dtype)
        ct = jax.random.normal(jax.random.key(1), qkvg[0].shape, jnp.float32)
        with jax.default_matmul_precision(precision):
            want = state_and_grads(xla_op, qkvg, ct)
        for blocks in grid:
            row = dict(dtype=jnp.dtype(dtype).name, blocks=dataclasses.asdict(blocks))
            try:
                with jax.default_matmul_precision(precision):
                    row["errors"] = rel_errs(state_and_grads(kernel_op(blocks), qkvg, ct), want)
            except Exception as error:
                row["failed"] = f"{type(error).__name__}: {str(error)[:1500]}"
            rows.append(row)
            result = row.get("errors") or row["failed"][:200]
            print(f"[{time.perf_counter() - START:6.1f}s] {row['dtype']} {blocks}: {result}", flush=True)
    long_args = inputs(2, 1, args.long, H, d, jnp.bfloat16)
    for row in rows:
        if row["dtype"] == "bfloat16" and "errors" in row and max(row["errors"].values()) < 2e-2:
            blocks = kernels.BlockSizes(**row["blocks"])
            row["fwd_s"], row["fwd_bwd_s"] = train_times(kernel_op(blocks), long_args, 10)
            print(
                f"[{time.perf_counter() - START:6.1f}s] T={args.long} {blocks}: fwd {row['fwd_s'] * 1e3:.3f} ms, "
                f"fwd+bwd {row['fwd_bwd_s'] * 1e3:.3f} ms",
                flush=True,
            )
    report = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, T=args.T, long=args.long, rows=rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
