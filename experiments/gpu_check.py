"""One-command GPU check of the power-retention Pallas kernels: correctness, training speed, decode speed.

1. Correctness at T=4096 (float32, exact matmuls): the kernels' y, final state and gradients (q, k, v, log_g)
   against the XLA chunked path, `retention.power_retention(impl="xla")`.
2. Forward and forward+backward times at T = 4k, 16k, 64k (B=1, H=8, d=64, bf16, gated): Pallas kernels, the XLA
   chunked path, and causal softmax through `jax.nn.dot_product_attention(implementation="cudnn")`.
3. Decode: one token against a 64k context, Pallas step against `retention.softmax_attention_step` (a KV cache
   holding 64k tokens), each as a compiled loop of steps.
Medians of several repeats after a warm-up (experiments/timing.py). Prints one table. About 5 minutes on an H200.

    python -m experiments.gpu_check            # on a GPU
    python -m experiments.gpu_check --quick    # CPU smoke run: interpret mode, tiny sizes, softmax via XLA
"""

import argparse
from functools import partial

import jax
import jax.numpy as jnp

from experiments.timing import median_seconds
from retention import init_kv_cache, init_state, power_retention, power_retention_step, softmax_attention_step


def rel_err(a, b) -> float:
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def inputs(seed, B, T, H, d, dtype):
    """q, k, v [B, T, H, d] in dtype (unit normal) and mild gates log_g [B, T, H] float32."""
    kq, kk, kv, kg = jax.random.split(jax.random.key(seed), 4)
    q, k, v = (jax.random.normal(key, (B, T, H, d), jnp.float32).astype(dtype) for key in (kq, kk, kv))
    return q, k, v, jax.nn.log_sigmoid(3.0 + jax.random.normal(kg, (B, T, H), jnp.float32))


def pallas_op(chunk):
    """(y, state) of the kernels from an empty state."""
    return lambda q, k, v, log_g: power_retention(q, k, v, log_g, chunk_size=chunk, return_state=True, impl="pallas")


def xla_op(chunk):
    return lambda q, k, v, log_g: power_retention(q, k, v, log_g, chunk_size=chunk, return_state=True, impl="xla")


def softmax_op(quick):
    impl = None if quick else "cudnn"
    return lambda q, k, v, log_g: (jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl), None)


def loss_grad(op, ct):
    """jit'd gradients in (q, k, v, log_g) of <op(q, k, v, log_g)[0], ct>."""
    return jax.jit(jax.grad(lambda *a: jnp.vdot(op(*a)[0], ct), argnums=(0, 1, 2, 3)))


def check(T, H, d, chunk):
    """Relative errors of the kernels against the XLA chunked path, float32 with exact matmuls."""
    q, k, v, log_g = inputs(0, 1, T, H, d, jnp.float32)
    ct = jax.random.normal(jax.random.key(1), q.shape, jnp.float32)
    out = {}
    with jax.default_matmul_precision("highest"):
        for name, op in (("pallas", pallas_op(chunk)), ("xla", xla_op(chunk))):
            y, state = jax.jit(op)(q, k, v, log_g)
            grads = loss_grad(op, ct)(q, k, v, log_g)
            out[name] = (y, state.S, state.z, *grads)
    names = ("y", "S", "z", "dq", "dk", "dv", "dlog_g")
    return {n: rel_err(a, b) for n, a, b in zip(names, out["pallas"], out["xla"])}


def train_times(op, q, k, v, log_g, repeats):
    """Median seconds of the jit'd forward and of forward+backward (random-cotangent loss)."""
    ct = jnp.ones(q.shape, jnp.float32)
    fwd = jax.jit(lambda *a: op(*a)[0])
    fwd_bwd = jax.jit(jax.grad(lambda *a: jnp.vdot(op(*a)[0].astype(jnp.float32), ct), argnums=(0, 1, 2)))
    return tuple(median_seconds(fn, q, k, v, log_g, repeats=repeats) for fn in (fwd, fwd_bwd))


@partial(jax.jit, static_argnames=("step", "n_steps"))
def decode_loop(carry, q, k, v, log_g, *, step, n_steps):
    """n_steps decode steps of one token, in one compiled loop; returns the last output and the carried state."""

    def body(_, c):
        return step(c[1], q, k, v, log_g)

    y0 = jnp.zeros(q.shape, q.dtype)
    return jax.lax.fori_loop(0, n_steps, body, (y0, carry))


def decode_times(context, H, d, n_steps, repeats):
    """Seconds per token for the Pallas step and for softmax against a KV cache holding `context` tokens."""
    B = 1
    q, k, v, log_g = inputs(2, B, 1, H, d, jnp.bfloat16)
    pallas_step = lambda s, q, k, v, g: power_retention_step(s, q, k, v, g, impl="pallas")
    xla_step = lambda s, q, k, v, g: power_retention_step(s, q, k, v, g, impl="xla")
    softmax_step = lambda c, q, k, v, g: softmax_attention_step(c, q, k, v)
    cache = init_kv_cache(B, H, d, context + n_steps, jnp.bfloat16)
    slots = jnp.arange(context + n_steps, dtype=jnp.int32)
    cache = cache._replace(pos=jnp.where(slots < context, slots, -1), length=jnp.asarray(context, jnp.int32))
    rows = {}
    cases = (
        ("pallas", pallas_step, init_state(B, H, d)),
        ("xla chunked", xla_step, init_state(B, H, d)),
        ("softmax kv-cache", softmax_step, cache),
    )
    for name, step, carry in cases:
        run = partial(decode_loop, step=step, n_steps=n_steps)
        rows[name] = median_seconds(run, carry, q, k, v, log_g, repeats=repeats) / n_steps
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: interpret mode, tiny sizes")
    args = parser.parse_args()
    if args.quick:
        H, d, chunk, check_T, lengths, context, n_steps, repeats = 2, 16, 16, 48, (32, 64), 64, 2, 1
    else:
        H, d, chunk, check_T, lengths, context, n_steps, repeats = 8, 64, 128, 4096, (4096, 16384, 65536), 65536, 32, 5
    print(f"device: {jax.devices()[0].device_kind}  B=1 H={H} d={d} chunk={chunk}")

    errors = check(check_T, H, d, chunk)
    print(f"\ncorrectness at T={check_T} (float32, relative error of the kernels against impl='xla'):")
    verdict = "-> ok" if max(errors.values()) < 1e-4 else "-> MISMATCH"
    print("  " + "  ".join(f"{n} {e:.1e}" for n, e in errors.items()), verdict)

    rows = []
    for T in lengths:
        q, k, v, log_g = inputs(T, 1, T, H, d, jnp.bfloat16)
        ops = (
            ("pallas", pallas_op(chunk)),
            ("xla chunked", xla_op(chunk)),
            ("softmax " + ("xla" if args.quick else "cudnn"), softmax_op(args.quick)),
        )
        for name, op in ops:
            t_f, t_fb = train_times(op, q, k, v, log_g, repeats)
            rows.append((f"train T={T}", name, f"{1e3 * t_f:10.3f}", f"{1e3 * t_fb:10.3f}", ""))
    for name, seconds in decode_times(context, H, d, n_steps, repeats).items():
        rows.append((f"decode ctx={context}", name, "", "", f"{1e3 * seconds:10.4f}"))

    header = ("case", "impl", "fwd ms", "fwd+bwd ms", "ms/token")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(5)]
    print("\n" + "  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
