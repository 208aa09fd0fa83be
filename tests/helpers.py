"""Shared test helpers: relative error, fresh random inputs, and a mixer's forward against its decode steps."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64; NaN anywhere gives NaN, which fails every `<` check."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def random_qkv(seed, B, T, Hq, H, d, dtype=jnp.float32, gate=None):
    """q [B,T,Hq,d], k and v [B,T,H,d] standard normal; log_g [B,T,H] float32 or None.

    gate: None (off), "mild" (log_sigmoid around -0.05) or "strong" (down to -20).
    """
    kq, kk, kv, kg = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(kq, (B, T, Hq, d), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (B, T, H, d), jnp.float32).astype(dtype)
    v = jax.random.normal(kv, (B, T, H, d), jnp.float32).astype(dtype)
    if gate is None:
        log_g = None
    elif gate == "mild":
        log_g = jax.nn.log_sigmoid(3.0 + jax.random.normal(kg, (B, T, H), jnp.float32))
    elif gate == "strong":
        log_g = -20.0 * jax.random.uniform(kg, (B, T, H), jnp.float32)
    else:
        raise ValueError(gate)
    return q, k, v, log_g


def f64(*xs):
    """Each array as float64 (None stays None)."""
    return tuple(None if x is None else jnp.asarray(x, jnp.float64) for x in xs)


@nnx.jit
def _forward(mixer, x, positions):
    return mixer(x, positions=positions)


@nnx.jit
def _prefill(mixer, x, positions, cache):
    return mixer.prefill(x, positions=positions, cache=cache)


@nnx.jit
def _decode(mixer, x, positions, cache):
    return mixer.decode(x, positions=positions, cache=cache)


def forward_and_decode_steps(mixer, x, n: int, prefill: int = 8):
    """A mixer on x [B, T, d_model] (positions 0..T-1), compiled: (its full forward [B, T, d_model], and the same
    rows from a prefill of the first `prefill` tokens followed by decode steps of n tokens). Compiled, not eager:
    eagerly every primitive of every step compiles on its own (3x slower)."""
    B, T, _ = x.shape
    positions = jnp.arange(T, dtype=jnp.int32)
    full = _forward(mixer, x, positions)
    cache = mixer.init_cache(B, T, x.dtype, step_tokens=n)
    rows, cache = _prefill(mixer, x[:, :prefill], positions[:prefill], cache)
    pieces = [rows]
    for lo in range(prefill, T, n):
        rows, cache = _decode(mixer, x[:, lo : lo + n], positions[lo : lo + n], cache)
        pieces.append(rows)
    return full, jnp.concatenate(pieces, axis=1)
