"""Bytes exchanged per training step, per layer, by context parallelism: power retention's state scan against
softmax attention's gathered K/V, at 64k to 1M tokens split over n devices.

Counted analytically (the collectives of `retention/ops/*/context_parallel.py`), per layer, for a batch of B
sequences of T tokens on a "sequence" axis of n devices:
- power retention: an exclusive associative scan of (log-decay, state) by collective-permute, 1 + ceil(log2 n)
  rounds; in each round a device receives at most one state and its log-decay, B*H*(D*(d+1) + 1) float32 numbers
  (D = C(d+p-1, p)).
  Independent of T.
- the matrix-state ops (linear attention, GLA, the gated delta rule): the same scan of (transition, state), the
  state B*H*d*d float32 numbers and the transition B*H (a log-decay), B*H*d (one per key channel) or B*H*d*d (the
  delta rule's matrix) float32 numbers, `matrix_state_bytes`. Independent of T.
- softmax attention: an all-gather of K and V over the axis: each device receives (n-1)/n * B*T*H*d*2 numbers
  (bf16 by default). Grows with T.
The backward moves the same again (the transpose of a collective-permute is a collective-permute back; of an
all-gather a reduce-scatter), so a training step moves twice the forward's bytes. With --hlo the forward bytes
are also read off the compiled program of the shard_map'd ops at the first length on n fake CPU devices (the
sizes of the collective_permute and all_gather results in the lowered StableHLO), as a check of the formulas.

    python -m experiments.comm_volume [--n 8] [--B 1] [--H 8] [--d 64] [--deg 2] [--kv-dtype bfloat16] [--hlo]

Prints a table and writes results/comm_volume.json (--out).
"""

import argparse
import json
import math
import os
import re
import sys
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp

from experiments.formatting import human_bytes, tokens
from retention import sympow_dim
from retention.ops import (
    gated_delta_rule_context_parallel,
    gated_linear_attention_context_parallel,
    linear_attention_context_parallel,
    power_retention_context_parallel,
    softmax_attention_context_parallel,
)
from retention.parallel import make_mesh

CONTEXTS = tuple(65536 * 2**i for i in range(5))  # 64k .. 1M tokens
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def scan_rounds(n: int) -> int:
    """Collective-permute rounds of the exclusive scan over n devices: one shift, then ceil(log2 n)."""
    return 0 if n == 1 else 1 + math.ceil(math.log2(n))


def retention_bytes(n: int, B: int, H: int, d: int, deg: int) -> dict:
    """Forward bytes of the state scan: received by the busiest device, and by all devices together. Each round
    moves a float32 state [S | z], its log-decay (float32) and whether it resets (a bool per row and head: a
    document start or a -inf gate), except the last round's log-decay and reset flag (needed only with an initial
    state, so XLA drops them)."""
    state, decay = 4 * B * H * sympow_dim(d, deg) * (d + 1), (4 + 1) * B * H
    rounds = scan_rounds(n)
    senders = [n - 1] + [n - s for s in (2**i for i in range(rounds - 1))]  # the shift by one, then 1, 2, 4, ...
    total = sum(senders) * (state + decay) - (senders[-1] * decay if rounds else 0)
    return {"per_device": rounds * state + max(rounds - 1, 0) * decay, "total": total, "state_bytes": state}


MATRIX_STATE_OPS = ("linear_attention", "gated_linear_attention", "gated_delta_rule")


def matrix_state_bytes(n: int, B: int, H: int, d: int) -> dict:
    """Forward bytes per device of the matrix-state ops' scans (d_k = d_v = d): each round moves a float32 state
    [B, H, d, d], its transition (float32: a log-decay [B, H], per key channel [B, H, d], or the delta rule's
    matrix [B, H, d, d]) and its reset flag (a bool per row and head), but the last round only the state (the
    transition and flag are needed only with an initial state, so they are dropped)."""
    state, rounds = 4 * B * H * d * d, scan_rounds(n)
    transitions = {"linear_attention": 4 * B * H, "gated_linear_attention": 4 * B * H * d}
    transitions["gated_delta_rule"] = 4 * B * H * d * d
    return {op: rounds * state + max(rounds - 1, 0) * (t + B * H) for op, t in transitions.items()}


def gathered_kv_bytes(n: int, T: int, B: int, H: int, d: int, kv_bytes: int) -> dict:
    """Forward bytes of the K/V all-gather: each device receives the other devices' slices of K and V."""
    per_device = (n - 1) * (T // n) * B * H * d * 2 * kv_bytes
    return {"per_device": per_device, "total": n * per_device}


def hlo_bytes(n: int, T: int, B: int, H: int, d: int, deg: int, kv_dtype: str) -> dict:
    """Forward bytes per device read off the lowered program (StableHLO, before any backend pass) on n fake CPU
    devices: the result sizes of the collective_permutes (retention; each received once) and all_gathers
    (softmax; (n-1)/n of the result is received). The CPU backend then gathers bf16 as float32 (twice the
    bytes); GPU and TPU collectives carry bf16 as it is."""
    if jax.device_count() != n:
        raise SystemExit(f"--hlo needs {n} devices, got {jax.device_count()}")
    mesh = make_mesh(1, 1, n)
    q = jax.ShapeDtypeStruct((B, T, H, d), jnp.dtype(kv_dtype))
    g = jax.ShapeDtypeStruct((B, T, H), jnp.float32)
    itemsize = {"f32": 4, "bf16": 2, "f16": 2, "i32": 4, "f64": 8, "i1": 1}

    def collective_bytes(fn, *args, op):
        total = 0
        for line in jax.jit(fn).lower(*args).as_text().splitlines():
            if f'"stablehlo.{op}"' in line:
                *dims, dtype = re.findall(r"-> tensor<([^>]*)>", line)[-1].split("x")
                total += itemsize[dtype] * math.prod(int(x) for x in dims)
        return total

    retention = partial(power_retention_context_parallel, deg=deg, mesh=mesh)
    ret = collective_bytes(retention, q, q, q, g, op="collective_permute")
    soft = collective_bytes(partial(softmax_attention_context_parallel, mesh=mesh), q, q, q, op="all_gather")
    f32 = jax.ShapeDtypeStruct((B, T, H, d), jnp.float32)
    matrix = {
        "linear_attention": (linear_attention_context_parallel, (f32, f32, f32, g)),
        "gated_linear_attention": (gated_linear_attention_context_parallel, (f32, f32, f32, f32)),
        "gated_delta_rule": (gated_delta_rule_context_parallel, (f32, f32, f32, g, g)),
    }
    matrix = {
        op: collective_bytes(partial(fn, mesh=mesh), *a, op="collective_permute") for op, (fn, a) in matrix.items()
    }
    return {"T": T, "retention_per_device": ret, "gathered_kv_per_device": soft * (n - 1) // n, "matrix_state": matrix}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8, help="devices on the sequence axis")
    parser.add_argument("--B", type=int, default=1, help="sequences per step")
    parser.add_argument("--H", type=int, default=8, help="kv heads")
    parser.add_argument("--d", type=int, default=64, help="head dim")
    parser.add_argument("--deg", type=int, default=2, help="power (even)")
    parser.add_argument("--kv-dtype", default="bfloat16", choices=tuple(DTYPE_BYTES))
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    parser.add_argument(
        "--hlo",
        action="store_true",
        help="also measure the forward bytes in the compiled HLO at the first context (n fake CPU devices; lowers "
        "both ops, seconds)",
    )
    parser.add_argument("--out", default="results/comm_volume.json")
    args = parser.parse_args()
    if args.n < 1:
        parser.error(f"--n must be >= 1 (devices on the sequence axis), got {args.n}")
    if args.deg < 2 or args.deg % 2:
        parser.error(f"--deg must be an even int >= 2, got {args.deg}")
    if bad := [T for T in args.contexts if T % args.n]:
        parser.error(f"--contexts must be multiples of --n={args.n}, got {bad}")

    n, B, H, d, deg = args.n, args.B, args.H, args.d, args.deg
    kv_bytes = DTYPE_BYTES[args.kv_dtype]
    ret = retention_bytes(n, B, H, d, deg)
    rows = []
    for T in args.contexts:
        kv = gathered_kv_bytes(n, T, B, H, d, kv_bytes)
        rows.append(
            {
                "T": T,
                "retention_fwd_per_device": ret["per_device"],
                "retention_step_per_device": 2 * ret["per_device"],
                "gathered_kv_fwd_per_device": kv["per_device"],
                "gathered_kv_step_per_device": 2 * kv["per_device"],
                "retention_fwd_total": ret["total"],
                "gathered_kv_fwd_total": kv["total"],
                "ratio": kv["per_device"] / ret["per_device"] if ret["per_device"] else float("inf"),
            }
        )
    print(
        f"Bytes received per device per layer, one training step (forward + backward), n={n} devices on the "
        f"sequence axis, B={B}, H={H}, d={d}, deg={deg} (D={sympow_dim(d, deg)}); state float32, "
        f"K/V {args.kv_dtype}; scan rounds {scan_rounds(n)}"
    )
    print("| T | power retention (state scan) | softmax (gathered K/V) | K/V / state |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        retention, kv = human_bytes(r["retention_step_per_device"]), human_bytes(r["gathered_kv_step_per_device"])
        print(f"| {tokens(r['T'])} | {retention} | {kv} | {r['ratio']:.0f}x |")
    out = {
        "n": n,
        "B": B,
        "H": H,
        "d": d,
        "deg": deg,
        "D": sympow_dim(d, deg),
        "kv_dtype": args.kv_dtype,
        "scan_rounds": scan_rounds(n),
        "state_bytes": ret["state_bytes"],
        "rows": rows,
        "matrix_state_fwd_per_device": matrix_state_bytes(n, B, H, d),
    }
    print(
        "Matrix-state ops (d_k = d_v = d), forward bytes per device per layer (a training step: twice): "
        + ", ".join(f"{op} {human_bytes(b)}" for op, b in out["matrix_state_fwd_per_device"].items())
    )
    if args.hlo:
        measured = hlo_bytes(n, args.contexts[0], B, H, d, deg, args.kv_dtype)
        T = measured["T"]
        formula_kv = gathered_kv_bytes(n, T, B, H, d, kv_bytes)["per_device"]
        print(
            f"HLO check at T={tokens(T)}, forward, per device: retention "
            f"{human_bytes(measured['retention_per_device'])} (formula {human_bytes(ret['per_device'])}), gathered "
            f"K/V {human_bytes(measured['gathered_kv_per_device'])} (formula {human_bytes(formula_kv)})"
        )
        print(
            "HLO check, matrix-state ops, forward, per device: "
            + ", ".join(f"{op} {human_bytes(b)}" for op, b in measured["matrix_state"].items())
        )
        out["hlo_forward"] = measured
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    if "--hlo" in sys.argv and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        n = int(sys.argv[sys.argv.index("--n") + 1]) if "--n" in sys.argv else 8
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}"
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
