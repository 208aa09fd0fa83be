"""One-command device check of the power-retention Pallas kernels: correctness, a block-size sweep, training and
decode speed against the baselines, and a 2-layer LM train step. About 8 minutes on one H200; prints progress.

1. Correctness at T=4096 (float32, exact matmuls): the kernels' final state and gradients (q, k, v, log_g; they
   carry any error in y) against the XLA chunked path, `power_retention(impl="xla")`.
2. Sweep: forward+backward of the kernels for every `candidate_block_sizes` entry (block sizes and chunk size) at
   T=16k, then the best three and the committed default at 4k and 64k, forward and forward+backward (B=1, H=8,
   d=64, bf16, gated). The best at 64k is written where `default_block_sizes` reads it (`write_tuned`). On GPU the
   Mosaic GPU forward (`BlockSizes.forward="mosaic"`, chunks 64 and 128) runs beside the Triton candidates once its
   bf16 outputs and gradients match the Triton kernels' at T=4096 (so it becomes the default only where faster);
   a Mosaic failure is logged and recorded, and the rest of the check goes on.
3. Baselines at the same shapes: the XLA chunked path and causal softmax attention (cuDNN flash attention on GPU,
   blockwise XLA elsewhere).
4. Decode: one token against a 64k context, the kernels' step against `softmax_attention_step` (a KV cache of 64k
   tokens), each as a compiled loop of steps.
5. A 2-layer LM train step (AdamW) at T=16k, all-P (kernels) and all-A (softmax), built from LMConfig (no Hydra).
Medians after a warm-up (experiments/timing.py). One table on stdout, one JSON (--out; default
results/gpu_check.json, or $OUT/gpu_check.json when $OUT is set). `--max-minutes` stops the sweep early.

    python -m experiments.gpu_check            # on a GPU (or TPU)
    python -m experiments.gpu_check --quick    # CPU smoke run: interpret mode, tiny sizes, nothing tuned written
"""

import argparse
import dataclasses
import json
import os
import time
from functools import partial

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import pallas_kernels.power_retention as kernels
from experiments.timing import median_seconds
from retention import (
    init_kv_cache,
    init_state,
    power_retention,
    power_retention_step,
    softmax_attention,
    softmax_attention_step,
)
from retention.nn import LM, LMConfig
from retention.ops.power_retention.pallas import chunked_pallas

FULL = dict(
    H=8, d=64, check_T=4096, sweep_T=16384, lengths=(4096, 65536), context=65536, steps=32, repeats=5, lm_T=16384
)
QUICK = dict(H=2, d=16, check_T=32, sweep_T=32, lengths=(), context=32, steps=2, repeats=1, lm_T=16)
START = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {message}", flush=True)


def rel_err(a, b) -> float:
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def inputs(seed, B, T, H, d, dtype):
    """q, k, v [B, T, H, d] in dtype (unit normal) and mild gates log_g [B, T, H] float32."""
    kq, kk, kv, kg = jax.random.split(jax.random.key(seed), 4)
    q, k, v = (jax.random.normal(key, (B, T, H, d), jnp.float32).astype(dtype) for key in (kq, kk, kv))
    return q, k, v, jax.nn.log_sigmoid(3.0 + jax.random.normal(kg, (B, T, H), jnp.float32))


def kernel_op(blocks):
    """(y, state) of the kernels with `blocks` (chunk size included) from an empty state."""

    def op(q, k, v, log_g):
        state = init_state(q.shape[0], k.shape[2], q.shape[-1])
        return chunked_pallas(
            q, k, v, log_g, state, deg=2, scale=q.shape[-1] ** -0.5, chunk_size=blocks.chunk, block_sizes=blocks
        )

    return op


def xla_op(q, k, v, log_g):
    return power_retention(q, k, v, log_g, return_state=True, impl="xla")


def softmax_op(q, k, v, log_g):
    return softmax_attention(q, k, v), None


def _loss(op, ct, q, k, v, log_g):
    """(<y, ct>, the final state) of op."""
    y, state = op(q, k, v, log_g)
    return jnp.vdot(y, ct), state


GRADIENT_NAMES = ("S", "z", "dq", "dk", "dv", "dlog_g")  # dq, dk, dv, dlog_g check y through the cotangent


def state_and_grads(op, args, ct) -> tuple:
    """op's final state and the gradients of <y, ct> (GRADIENT_NAMES' order), from one compiled value-and-grad.

    Args:
        op: (q, k, v, log_g) -> (y, state).
        args: (q, k, v, log_g).
        ct: the cotangent of y.

    Returns:
        (S, z, dq, dk, dv, dlog_g).
    """
    grad = jax.value_and_grad(partial(_loss, op, ct), argnums=(0, 1, 2, 3), has_aux=True)
    (_, final), grads = jax.jit(grad)(*args)
    return (final.S, final.z, *grads)


def rel_errs(got: tuple, want: tuple) -> dict:
    """{name: relative error} of two `state_and_grads` results."""
    return {n: rel_err(a, b) for n, a, b in zip(GRADIENT_NAMES, got, want)}


def check(T, H, d, blocks):
    """Relative errors of the kernels against the XLA chunked path, float32 with exact matmuls (one compiled
    value-and-gradient per path)."""
    args = inputs(0, 1, T, H, d, jnp.float32)
    ct = jax.random.normal(jax.random.key(1), args[0].shape, jnp.float32)
    with jax.default_matmul_precision("highest"):
        return rel_errs(state_and_grads(kernel_op(blocks), args, ct), state_and_grads(xla_op, args, ct))


def mosaic_candidates(backend, sizes) -> list:
    """The Mosaic GPU forward at chunks 64 and 128, the committed GPU blocks otherwise (GPU only, d a multiple of
    64, not --quick: it has no CPU mode at d < 64)."""
    d = sizes["d"]
    if backend != "gpu" or sizes is QUICK or d % 64:
        return []
    base = kernels.candidate_block_sizes(backend, d)[0]
    return [dataclasses.replace(base, forward="mosaic", chunk=c) for c in (64, 128)]


def check_mosaic(T, H, d, blocks) -> dict:
    """bf16 relative errors of the Mosaic forward's final state and gradients (y through the cotangent) against
    the Triton kernels' at the same chunk, or {"failed": the error} where it does not compile or run."""
    args = inputs(0, 1, T, H, d, jnp.bfloat16)
    ct = jax.random.normal(jax.random.key(1), args[0].shape, jnp.float32)
    try:
        out = {
            name: state_and_grads(kernel_op(dataclasses.replace(blocks, forward=name)), args, ct)
            for name in ("mosaic", "triton")
        }
    except Exception as error:  # the first device run of this kernel: record what fails, keep checking the rest
        return {"failed": f"{type(error).__name__}: {str(error)[:2000]}"}
    return rel_errs(out["mosaic"], out["triton"])


def train_times(op, args, repeats, forward: bool = True):
    """Median seconds of the jit'd forward (None unless `forward`) and of forward+backward."""
    ct = jnp.ones(args[0].shape, jnp.float32)
    fwd_bwd = jax.jit(jax.grad(lambda *a: jnp.vdot(op(*a)[0].astype(jnp.float32), ct), argnums=(0, 1, 2)))
    t_fb = median_seconds(fwd_bwd, *args, repeats=repeats)
    t_f = median_seconds(jax.jit(lambda *a: op(*a)[0]), *args, repeats=repeats) if forward else None
    return t_f, t_fb


def sweep(sizes, backend, max_seconds, extra=()):
    """[(blocks, {T: (fwd s, fwd+bwd s)})]: every candidate at sizes["sweep_T"] (fwd+bwd), the `extra` ones right
    after the default, then the best three and the default at the other lengths; stops starting new runs after
    `max_seconds` of the whole check."""
    H, d, T0 = sizes["H"], sizes["d"], sizes["sweep_T"]
    grid = kernels.candidate_block_sizes(backend, d)
    candidates = grid[:1] + list(extra) + grid[1:]
    if sizes is QUICK:  # the default alone, in chunks the tiny length fills
        candidates = [dataclasses.replace(candidates[0], chunk=16)]
    args = inputs(T0, 1, T0, H, d, jnp.bfloat16)
    results = []
    for i, blocks in enumerate(candidates):
        if time.perf_counter() - START > max_seconds and results:
            log(f"sweep: time limit, {len(candidates) - i} candidates left out")
            break
        results.append((blocks, {T0: train_times(kernel_op(blocks), args, sizes["repeats"], forward=False)}))
        log(f"sweep T={T0} {i + 1}/{len(candidates)} {label(blocks)}: fwd+bwd {1e3 * results[-1][1][T0][1]:.3f} ms")
    results.sort(key=lambda r: r[1][T0][1])
    chosen = results[:3] + [r for r in results[3:] if r[0] == candidates[0]]
    for T in sizes["lengths"]:
        args = inputs(T, 1, T, H, d, jnp.bfloat16)
        for blocks, times in chosen:
            times[T] = train_times(kernel_op(blocks), args, sizes["repeats"])
            log(f"sweep T={T} {label(blocks)}: fwd {1e3 * times[T][0]:.3f} ms, fwd+bwd {1e3 * times[T][1]:.3f} ms")
    return results


@partial(jax.jit, static_argnames=("step", "n_steps"))
def decode_loop(carry, q, k, v, log_g, *, step, n_steps):
    """n_steps decode steps of one token, in one compiled loop; returns the last output and the carried state."""
    y0 = jnp.zeros(q.shape, q.dtype)
    return jax.lax.fori_loop(0, n_steps, lambda _, c: step(c[1], q, k, v, log_g), (y0, carry))


def decode_times(context, H, d, n_steps, repeats):
    """Seconds per token: the kernels' step, the XLA step, and softmax against a KV cache of `context` tokens."""
    q, k, v, log_g = inputs(2, 1, 1, H, d, jnp.bfloat16)
    cache = init_kv_cache(1, H, d, context + n_steps, jnp.bfloat16)
    slots = jnp.arange(context + n_steps, dtype=jnp.int32)
    cache = cache._replace(pos=jnp.where(slots < context, slots, -1), length=jnp.asarray(context, jnp.int32))
    cases = (
        ("pallas", lambda s, *x: power_retention_step(s, *x, impl="pallas"), init_state(1, H, d)),
        ("xla", lambda s, *x: power_retention_step(s, *x, impl="xla"), init_state(1, H, d)),
        ("softmax kv-cache", lambda c, q, k, v, g: softmax_attention_step(c, q, k, v), cache),
    )
    rows = {}
    for name, step, carry in cases:
        run = partial(decode_loop, step=step, n_steps=n_steps)
        rows[name] = median_seconds(run, carry, q, k, v, log_g, repeats=repeats) / n_steps
    return rows


def lm_step_seconds(pattern: str, T: int, quick: bool, repeats: int) -> float:
    """Median seconds of one AdamW train step of a 2-layer LM of `pattern` ("P" on the kernels, "A" softmax), B=1."""
    width = dict(d_model=32, n_heads=2, n_kv_heads=2, head_dim=16) if quick else dict(head_dim=64)
    config = LMConfig(
        vocab_size=256, n_layers=2, pattern=pattern, dtype="bfloat16", retention_impl="pallas", chunk_size=None, **width
    )
    graphdef, params = nnx.split(LM(config, rngs=nnx.Rngs(0)), nnx.Param)
    tx = optax.adamw(1e-4)
    tokens = jax.random.randint(jax.random.key(3), (1, T + 1), 0, config.vocab_size)

    @jax.jit
    def step(params, opt_state, tokens):
        def loss(params):
            logits = nnx.merge(graphdef, params)(tokens[:, :-1]).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return median_seconds(step, params, tx.init(params), tokens, repeats=repeats)


def table(rows) -> str:
    header = ("case", "impl", "fwd ms", "fwd+bwd ms", "ms/token", "ms/step")
    rows = [header] + [tuple("" if c is None else c for c in r) + ("",) * (len(header) - len(r)) for r in rows]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows)


def label(blocks) -> str:
    """The fields the GPU sweep varies, short (the JSON has every field)."""
    return f"{blocks.forward} chunk={blocks.chunk} rows={blocks.state_rows} warps={blocks.num_warps}"


def ms(seconds) -> str | None:
    return None if seconds is None else f"{1e3 * seconds:.4f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: interpret mode, tiny sizes")
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/gpu_check.json or results/)")
    parser.add_argument("--max-minutes", type=float, default=6.0, help="stop starting sweep runs after this")
    parser.add_argument("--tuned", default=kernels.config.TUNED_PATH, help="where the best block sizes go")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    H, d = sizes["H"], sizes["d"]
    out = args.out or os.path.join(os.environ.get("OUT") or "results", "gpu_check.json")
    device = jax.devices()[0]
    backend = kernels.resolve_backend(None)
    log(f"device {device.device_kind} ({backend} kernels{', interpreted' if args.quick else ''}) B=1 H={H} d={d}")

    default = kernels.candidate_block_sizes(backend, d)[0]
    try:
        errors = check(sizes["check_T"], H, d, dataclasses.replace(default, chunk=16) if args.quick else default)
    except Exception as error:  # the kernels do not compile here: say so in the JSON (gpu_kernel_matrix says where)
        failed = dict(
            device=device.device_kind, jax=jax.__version__, correctness={"failed": f"{type(error).__name__}: {error}"}
        )
        write_json(failed, out)
        raise
    ok = max(errors.values()) < 1e-4
    log(f"correctness T={sizes['check_T']}: " + " ".join(f"{n} {e:.1e}" for n, e in errors.items()) + (" ok" * ok))

    mosaic = {}
    for blocks in mosaic_candidates(backend, sizes):
        mosaic[blocks.chunk] = check_mosaic(sizes["check_T"], H, d, blocks)
        log(f"mosaic forward chunk={blocks.chunk} against triton: {mosaic[blocks.chunk]}")
    close = lambda errors: "failed" not in errors and max(errors.values()) < 2e-2
    passed = [b for b in mosaic_candidates(backend, sizes) if close(mosaic[b.chunk])]
    results = sweep(sizes, backend, 60 * args.max_minutes, extra=passed)
    longest = max((*sizes["lengths"], sizes["sweep_T"]))
    best = min((r for r in results if longest in r[1]), key=lambda r: r[1][longest][1])[0]
    rows = [
        (f"T={T}", f"pallas {label(b)}", ms(t[0]), ms(t[1])) for b, times in results for T, t in sorted(times.items())
    ]
    for T in sizes["lengths"] or (sizes["sweep_T"],):
        qkvg = inputs(T, 1, T, H, d, jnp.bfloat16)
        for name, op in (("xla chunked", xla_op), ("softmax " + ("xla" if args.quick else "cudnn"), softmax_op)):
            t_f, t_fb = train_times(op, qkvg, sizes["repeats"], forward=not args.quick)
            rows.append((f"T={T}", name, ms(t_f), ms(t_fb)))
            log(f"baseline T={T} {name}: fwd {ms(t_f) or '-'} ms, fwd+bwd {ms(t_fb)} ms")
    decode = decode_times(sizes["context"], H, d, sizes["steps"], sizes["repeats"])
    rows += [(f"decode ctx={sizes['context']}", n, None, None, ms(s)) for n, s in decode.items()]
    log("decode: " + " ".join(f"{n} {ms(s)} ms/token" for n, s in decode.items()))
    lm = {p: lm_step_seconds(p, sizes["lm_T"], args.quick, sizes["repeats"]) for p in ("P", "A")}
    rows += [(f"LM 2 layers T={sizes['lm_T']}", p, None, None, None, ms(s)) for p, s in lm.items()]
    log("LM step: " + " ".join(f"{p} {ms(s)} ms" for p, s in lm.items()))

    if not args.quick and ok and device.platform != "cpu":
        kernels.write_tuned(device.device_kind, d, best, path=args.tuned)
        log(f"best at T={longest}: {best}, written to {args.tuned}")
    print("\n" + table(rows))
    report = {
        "device": device.device_kind,
        "jax": jax.__version__,
        "quick": args.quick,
        "sizes": sizes,
        "correctness": {"errors": errors, "ok": ok},
        "mosaic_forward_against_triton": mosaic,
        "sweep": [
            {"blocks": dataclasses.asdict(b), "seconds": {str(T): t for T, t in times.items()}} for b, times in results
        ],
        "best": dataclasses.asdict(best),
        "table": [list(r) for r in rows],
        "decode_seconds_per_token": decode,
        "lm_step_seconds": lm,
        "wall_seconds": time.perf_counter() - START,
    }
    write_json(report, out)
    return report


def write_json(report: dict, out: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
