"""Op-level speed: chunked power retention against blockwise softmax attention and the matrix-state ops (linear
attention, GLA, the gated delta rule), forward and forward+backward, decode per token in a compiled loop, state
bytes against KV-cache bytes, achieved GFLOP/s against a matmul rate measured in the same run. Prints a table and
writes JSON.

    python -m experiments.op_speed            # T = 1k .. 64k (about 25 minutes on 2 cores)
    python -m experiments.op_speed --quick    # T = 1k .. 4k (about a minute)
    python -m experiments.op_speed --lengths 1024 4096 --skip-decode --merge   # add rows to the JSON
    python -m experiments.op_speed --dtype bfloat16 --repeats 10 --out $OUT/op_speed_gpu.json   # on a GPU

On a GPU, power retention runs both its XLA path and the Pallas kernels, and softmax (bf16) both the blockwise XLA
path and cuDNN's flash attention; PyTorch's SDPA runs on the GPU too where torch sees it.

FLOP counts (DESIGN section 1, per head): power forward 4*T*D*d (state write and read) + 2*T*c*d (inside
chunks); causal softmax forward 2*T^2*d; the matrix-state ops 2*T*c*(d_k + d_v) inside chunks plus 4*T*d_k*d_v
for the state (the delta rule twice both, for its keys' Gram matrix, W S and the solve). Forward+backward counts
3x the forward for all.

Timing: the median of --repeats calls after --warmups untimed ones (2: the first compiles; the second is the first
run after compiling, up to 4x the steady time at 64k on XLA CPU; `experiments/timing.run_times`).
"""

import argparse
import json
import os
from functools import partial

import jax
import jax.numpy as jnp
from tqdm import tqdm

from experiments.formatting import human_bytes
from experiments.timing import matmul_gflops, median_seconds
from retention import (
    gated_delta_rule,
    gated_delta_rule_step,
    gated_linear_attention,
    gated_linear_attention_step,
    init_kv_cache,
    init_state,
    linear_attention,
    linear_attention_step,
    power_retention,
    power_retention_step,
    softmax_attention,
    softmax_attention_step,
    sympow_dim,
)


def power_flops(T, H, d, deg, chunk):
    return H * (4 * T * sympow_dim(d, deg) * d + 2 * T * chunk * d)


def softmax_flops(T, H, d):
    return H * 2 * T * T * d


def matrix_state_flops(T, H, d, chunk, delta_rule=False):
    return (2 if delta_rule else 1) * H * (2 * T * chunk * 2 * d + 4 * T * d * d)


POWER_LABEL = {"xla": "", "pallas": " pallas"}  # the rows' names: "power c=128" is the XLA path, as in older JSON
SOFTMAX_LABEL = {"xla": "blockwise", "cudnn": "cudnn"}
MATRIX_STATE_CHUNK = 64
MATRIX_STATE_OPS = ("linear_attention", "gla", "gated_delta_rule")


def matrix_state_variants(B, T, H, d):
    """(name, op(q, k, v), flops) of each matrix-state op at chunk 64 with gates made from the inputs but not
    differentiated (log-sigmoid decays of v, beta a sigmoid of k; inputs, not constants, so XLA does not fold
    them at compile time) and the delta rule's keys L2-normalised inside the op call (as its mixer)."""
    c = MATRIX_STATE_CHUNK
    log_g = lambda v: jax.nn.log_sigmoid(4.0 + jax.lax.stop_gradient(v))
    beta = lambda k: jax.nn.sigmoid(jax.lax.stop_gradient(k[..., 0]))
    unit = lambda k: k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    ops = {
        "linear_attention": lambda q, k, v: linear_attention(q, k, v, log_g(v)[..., 0], chunk_size=c),
        "gla": lambda q, k, v: gated_linear_attention(q, k, v, log_g(v), chunk_size=c),
        "gated_delta_rule": lambda q, k, v: gated_delta_rule(q, unit(k), v, beta(k), log_g(v)[..., 0], chunk_size=c),
    }
    flops = lambda name: matrix_state_flops(T, H, d, c, delta_rule=name == "gated_delta_rule")
    return [(f"{name} c={c}", op, flops(name)) for name, op in ops.items()]


def train_fns(op):
    """jit'd forward, and forward+backward of a random-cotangent loss, for op(q, k, v)."""
    fwd = jax.jit(op)
    fwd_bwd = jax.jit(jax.grad(lambda q, k, v, ct: jnp.vdot(op(q, k, v), ct), argnums=(0, 1, 2)))
    return fwd, fwd_bwd


def time_training(args, T, rows):
    B, H, d = args.batch, args.heads, args.head_dim
    q, k, v, ct = jax.random.normal(jax.random.key(T), (4, B, T, H, d), jnp.float32).astype(args.dtype)
    power_impls = ("xla", "pallas") if jax.default_backend() == "gpu" else ("xla",)
    variants = [
        (
            f"power{POWER_LABEL[impl]} c={c}",
            partial(power_retention, chunk_size=c, impl=impl),
            power_flops(T, H, d, 2, c),
        )
        for impl in power_impls
        for c in args.chunks
    ]
    softmax_impls = ("xla", "cudnn") if jax.default_backend() == "gpu" and args.dtype == "bfloat16" else ("xla",)
    variants += [
        (f"softmax {SOFTMAX_LABEL[impl]}", partial(softmax_attention, impl=impl), softmax_flops(T, H, d))
        for impl in softmax_impls
    ]
    variants += [v for v in matrix_state_variants(B, T, H, d) if v[0].split()[0] in args.matrix_state_ops]
    for name, op, flops in variants:
        fwd, fwd_bwd = train_fns(op)
        try:
            t_f = median_seconds(fwd, q, k, v, repeats=args.repeats, warmups=args.warmups)
            t_fb = median_seconds(fwd_bwd, q, k, v, ct, repeats=args.repeats, warmups=args.warmups)
        except Exception as error:  # a kernel's first run on a device: the error is the row, the other ops go on
            if not args.keep_going:
                raise
            rows.append(dict(kind="failed", name=name, T=T, error=f"{type(error).__name__}: {str(error)[:2000]}"))
            print(f"{name} T={T} failed: {rows[-1]['error'][:300]}", flush=True)
            continue
        rows.append(train_row(name, T, t_f, t_fb, flops))
    torch_row = time_torch_sdpa(B, T, H, d, args.repeats, args.warmups, args.dtype)
    if torch_row:
        rows.append(torch_row)


def train_row(name, T, t_f, t_fb, flops):
    """One training-time row: forward and forward+backward seconds and the GFLOP/s they achieve."""
    return dict(
        kind="train",
        name=name,
        T=T,
        fwd_s=t_f,
        fwd_bwd_s=t_fb,
        flops_fwd=flops,
        gflops_fwd=flops / t_f / 1e9,
        gflops_fwd_bwd=3 * flops / t_fb / 1e9,
    )


def time_torch_sdpa(B, T, H, d, repeats, warmups, dtype):
    """PyTorch's scaled_dot_product_attention (its flash kernel) as the outside reference, if torch is installed:
    on the GPU when JAX runs on one and torch sees it (each call synchronised), on the CPU otherwise."""
    try:
        import torch
    except ImportError:
        return None

    on_gpu = jax.default_backend() == "gpu" and torch.cuda.is_available()
    device, sync = ("cuda", torch.cuda.synchronize) if on_gpu else ("cpu", lambda: None)
    options = dict(device=device, dtype=getattr(torch, jnp.dtype(dtype).name), requires_grad=True)
    q, k, v = (torch.randn(B, H, T, d, **options) for _ in range(3))
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def synced(fn):
        fn()
        sync()

    t_f = median_seconds(lambda: synced(lambda: sdpa().detach()), repeats=repeats, warmups=warmups)
    t_fb = median_seconds(lambda: synced(lambda: sdpa().float().sum().backward()), repeats=repeats, warmups=warmups)
    return train_row(f"torch sdpa {device}", T, t_f, t_fb, softmax_flops(T, H, d))


def time_decode(args, context, rows):
    """Seconds per token of n steps inside one compiled scan, for the power state and a KV cache at `context`."""
    B, H, d, n = args.batch, args.heads, args.head_dim, args.decode_tokens
    q, k, v = jax.random.normal(jax.random.key(context), (3, n, B, 1, H, d), jnp.float32).astype(args.dtype)

    state = init_state(B, H, d, 2)
    state = state._replace(
        S=jax.random.normal(jax.random.key(1), state.S.shape, state.S.dtype), z=jnp.abs(state.z) + 1.0
    )
    cache = init_kv_cache(B, H, d, context + n, args.dtype)
    kc, vc = jax.random.normal(jax.random.key(2), (2,) + cache.k.shape).astype(args.dtype)
    slots = jnp.arange(context + n, dtype=jnp.int32)
    pos = jnp.where(slots < context, slots, -1)  # filled to `context`
    cache = cache._replace(k=kc, v=vc, pos=pos, length=jnp.asarray(context, jnp.int32))
    t_power = (
        median_seconds(scan_steps(power_retention_step), state, q, k, v, repeats=args.repeats, warmups=args.warmups) / n
    )
    t_kv = (
        median_seconds(scan_steps(softmax_attention_step), cache, q, k, v, repeats=args.repeats, warmups=args.warmups)
        / n
    )
    state_bytes = sum(x.nbytes for x in state)
    kv_bytes = 2 * B * context * H * d * jnp.dtype(args.dtype).itemsize
    rows.append(
        dict(
            kind="decode",
            T=context,
            power_ms_per_token=t_power * 1e3,
            kv_ms_per_token=t_kv * 1e3,
            speedup=t_kv / t_power,
            state_bytes=state_bytes,
            kv_bytes=kv_bytes,
            byte_ratio=kv_bytes / state_bytes,
        )
    )


def matrix_state_step_fns():
    """(name, step(state, q, k, v) -> (y, state)) of each matrix-state op's decode step, gates and beta made from
    the inputs as in `matrix_state_variants`."""
    log_g = lambda v: jax.nn.log_sigmoid(4.0 + v)
    unit = lambda k: k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    return {
        "linear_attention": lambda s, q, k, v: linear_attention_step(s, q, k, v, log_g(v)[..., 0]),
        "gla": lambda s, q, k, v: gated_linear_attention_step(s, q, k, v, log_g(v)),
        "gated_delta_rule": lambda s, q, k, v: gated_delta_rule_step(
            s, q, unit(k), v, jax.nn.sigmoid(k[..., 0]), log_g(v)[..., 0]
        ),
    }


def scan_steps(step):
    """A compiled loop of n decode steps: (carry, q, k, v [n, B, 1, H, d]) -> (carry, y [n, B, 1, H, d])."""

    def loop(carry, q, k, v):
        def body(carry, x):
            y, carry = step(carry, *x)
            return carry, y

        return jax.lax.scan(body, carry, (q, k, v))

    return jax.jit(loop)


def time_matrix_state_decode(args, rows):
    """Seconds per token of each matrix-state op's decode step in a compiled loop (its state does not depend on
    the context, so one row per op) and its state bytes."""
    B, H, d, n = args.batch, args.heads, args.head_dim, args.decode_tokens
    q, k, v = jax.random.normal(jax.random.key(3), (3, n, B, 1, H, d), jnp.float32).astype(args.dtype)
    state = jax.random.normal(jax.random.key(4), (B, H, d, d), jnp.float32)
    for name, step in matrix_state_step_fns().items():
        if name in args.matrix_state_ops:
            t = median_seconds(scan_steps(step), state, q, k, v, repeats=args.repeats, warmups=args.warmups) / n
            rows.append(dict(kind="decode_op", name=name, ms_per_token=t * 1e3, state_bytes=state.nbytes))


def print_tables(rows, peak, dtype):
    print(f"\nmatmul rate (4096^3, {dtype}): {peak:.0f} GFLOP/s")
    print(f"\n{'variant':<24}{'T':>7}{'fwd ms':>11}{'GF/s':>7}{'%peak':>7}{'fwd+bwd ms':>12}{'GF/s':>7}{'%peak':>7}")
    for r in (r for r in rows if r["kind"] == "train"):
        fwd = f"{1e3 * r['fwd_s']:>11.3f}{r['gflops_fwd']:>7.0f}{100 * r['gflops_fwd'] / peak:>7.0f}"
        fwd_bwd = f"{1e3 * r['fwd_bwd_s']:>12.3f}{r['gflops_fwd_bwd']:>7.0f}{100 * r['gflops_fwd_bwd'] / peak:>7.0f}"
        print(f"{r['name']:<24}{r['T']:>7}{fwd}{fwd_bwd}")
    print(f"\n{'T':>7}{'best power fwd+bwd ms':>23}{'softmax fwd+bwd ms':>20}{'speed-up':>10}")
    for T in sorted({r["T"] for r in rows if r["kind"] == "train"}):
        at_T = [r for r in rows if r["kind"] == "train" and r["T"] == T]
        power = min((r["fwd_bwd_s"] for r in at_T if r["name"].startswith("power")), default=float("nan"))
        soft = min((r["fwd_bwd_s"] for r in at_T if r["name"].startswith(("softmax", "torch"))), default=float("nan"))
        print(f"{T:>7}{1e3 * power:>23.3f}{1e3 * soft:>20.3f}{soft / power:>10.1f}")
    matrix_state = [r for r in rows if r["kind"] == "train" and r["name"].split()[0] in MATRIX_STATE_OPS]
    if matrix_state:
        print(f"\n{'matrix-state op':<26}{'T':>7}{'fwd+bwd ms':>12}{'/ best power':>14}")
        for r in matrix_state:
            at_T = [p for p in rows if p["kind"] == "train" and p["T"] == r["T"] and p["name"].startswith("power")]
            power = min((p["fwd_bwd_s"] for p in at_T), default=float("nan"))
            print(f"{r['name']:<26}{r['T']:>7}{1e3 * r['fwd_bwd_s']:>12.3f}{r['fwd_bwd_s'] / power:>14.2f}")
    header = f"{'context':>8}{'power ms/tok':>14}{'KV ms/tok':>11}{'speed-up':>10}{'state':>10}{'KV cache':>12}"
    print(f"\n{header}{'bytes x':>9}")
    for r in (r for r in rows if r["kind"] == "decode"):
        times = f"{r['power_ms_per_token']:>14.3f}{r['kv_ms_per_token']:>11.3f}{r['speedup']:>10.1f}"
        sizes = f"{human_bytes(r['state_bytes']):>10}{human_bytes(r['kv_bytes']):>12}{r['byte_ratio']:>9.1f}"
        print(f"{r['T']:>8}{times}{sizes}")
    for r in (r for r in rows if r["kind"] == "failed"):
        print(f"\nfailed: {r['name']} T={r['T']}: {r['error'][:300]}")
    ops = [r for r in rows if r["kind"] == "decode_op"]
    if ops:
        print(f"\n{'matrix-state decode':<22}{'ms/tok':>9}{'state':>10}  (any context)")
        for r in ops:
            print(f"{r['name']:<22}{r['ms_per_token']:>9.3f}{human_bytes(r['state_bytes']):>10}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="T = 1k..4k only")
    parser.add_argument("--lengths", type=int, nargs="+", help="training lengths (default 1k..64k, quick 1k..4k)")
    parser.add_argument("--contexts", type=int, nargs="+", help="decode contexts (default 1k..64k, quick 1k, 4k)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls, their median reported")
    parser.add_argument(
        "--warmups", type=int, default=2, help="untimed calls first: compiling, then the slow first run after it"
    )
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="of q, k, v and caches")
    parser.add_argument("--matrix-state-ops", nargs="*", default=list(MATRIX_STATE_OPS), choices=MATRIX_STATE_OPS)
    parser.add_argument("--skip-decode", action="store_true", help="time training only")
    parser.add_argument(
        "--keep-going", action="store_true", help="record a variant that raises as a 'failed' row and go on"
    )
    parser.add_argument("--merge", action="store_true", help="keep the JSON's rows; add the rows it does not have")
    parser.add_argument("--note", default="", help="the machine's state (e.g. pinned to one core, shared), recorded")
    parser.add_argument("--out", default="results/op_speed.json")
    args = parser.parse_args(argv)
    for name in ("batch", "heads", "head_dim", "repeats", "warmups", "decode_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    lengths = args.lengths or ([1024, 2048, 4096] if args.quick else [1024, 4096, 16384, 32768, 65536])
    contexts = args.contexts or ([1024, 4096] if args.quick else [1024, 4096, 16384, 65536])

    peak = matmul_gflops(dtype=jnp.dtype(args.dtype))
    rows = []
    for T in tqdm(lengths, desc="training lengths"):
        time_training(args, T, rows)
    for context in [] if args.skip_decode else tqdm(contexts, desc="decode contexts"):
        time_decode(args, context, rows)
    if not args.skip_decode:
        time_matrix_state_decode(args, rows)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    machine = dict(
        backend=jax.default_backend(), devices=[str(x) for x in jax.devices()], cpus=os.cpu_count(), jax=jax.__version__
    )
    machine.update(usable_cpus=len(os.sched_getaffinity(0)), note=args.note)
    result = dict(machine=machine, config=vars(args), matmul_gflops=peak, rows=rows)
    if args.merge and os.path.exists(args.out):
        with open(args.out) as f:
            result = json.load(f)
        key = lambda r: (r["kind"], r.get("name"), r.get("T"))
        known = {key(r) for r in result["rows"]}
        added = [r for r in rows if key(r) not in known]
        result["rows"] += added
        result.setdefault("merged", []).append(dict(config=vars(args), matmul_gflops=peak, rows=len(added)))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print_tables(rows, peak, args.dtype)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
