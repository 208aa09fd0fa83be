"""The Mosaic GPU forward's block algorithm in jnp (mosaic_forward.py's kernels, for the CPU, where Mosaic GPU
does not run): the same inputs, block functions (mosaic_blocks.py), operand roundings (bf16 operands built in
float32 and rounded once, float32 accumulation) and accumulation order over chunks and state rows; only the
order of the float32 sums inside one matmul is XLA's instead of the tensor cores'."""

import jax
import jax.numpy as jnp
from einops import rearrange

from pallas_kernels.power_retention.kernel_math import Matmul, dot
from pallas_kernels.power_retention.mosaic_blocks import (
    carried,
    denominator,
    feature_lhs,
    intra_weights,
    normalised,
    read_mask,
    selected_read,
)


def _mm(x):
    return Matmul(x.dtype, jax.lax.Precision.DEFAULT)


def _advance(S, x, u, gamma, carry):
    """One chunk of one (b, h): every row a of S [d, d, e] carried, plus (k~ * k~_a)^T v; x = k~^T [d, c]."""

    def row(S_a, x_a):
        lhs = feature_lhs(x, x_a, axis=1)
        return carried(S_a, gamma, carry) + dot(lhs, u, _mm(lhs))

    return jax.vmap(row)(S, x)


def state_pass(kt, v, gamma, carry, init, *, chunk: int):
    """As mosaic_forward.state_pass: (before [B, H, N * d * d, e] in kt's dtype, final [B, H, d * d, e])."""
    B, H, d, Tp = kt.shape
    e = v.shape[-1]
    xs = (
        rearrange(kt, "B H d (N c) -> N B H d c", c=chunk),
        rearrange(v, "B H (N c) e -> N B H c e", c=chunk),
        rearrange(gamma, "B H (N d) -> N B H d", d=d),
        rearrange(carry, "B H (N d) -> N B H d", d=d),
    )

    def body(S, x):
        return jax.vmap(jax.vmap(_advance))(S, *x), S.astype(kt.dtype)

    final, before = jax.lax.scan(body, init.reshape(B, H, d, d, e), xs)
    return rearrange(before, "N B H a b e -> B H (N a b) e"), final.reshape(B, H, d * d, e)


def _chunk_output(qg, qgt, q, k, v, F, R, den_read, S, scale):
    """One (b, query head, chunk): y [c, e], den [c] from q~, q [c, d], q~^T [d, c], k, v [c, d], F, R,
    den_read [c] and the boundary state S [d, d, e]."""
    lhs = jax.vmap(lambda x_a: feature_lhs(qg, x_a, axis=0))(qgt)  # [a, c, b]
    inter = jnp.einsum(
        "acb,abe->ce", lhs, S.astype(lhs.dtype), preferred_element_type=jnp.float32, precision=_mm(lhs).precision
    )
    c = q.shape[0]
    ids = [jax.lax.broadcasted_iota(jnp.int32, (c, c), axis) for axis in (0, 1)]
    s = dot(q, k, _mm(q), trans_y=True)
    A = intra_weights(s, F, F, R, R, *ids, scale)
    read = read_mask(R)
    num = selected_read(inter, read) + dot(A.astype(q.dtype), v, _mm(q))
    den = denominator(A, den_read, read)
    return normalised(num, den), den


def output(qg, qgt, q, k, v, F, R, den_read, S_before, *, chunk: int, scale: float):
    """As mosaic_forward.output: (y [B, Hq, Tp, e], den [B, Hq, Tp]) float32."""
    B, Hq, Tp, d = q.shape
    g = Hq // k.shape[1]
    per_q = lambda x: rearrange(x, "B (H g) (N c) d -> B H g N c d", g=g, c=chunk)
    per_kv = lambda x: rearrange(x, "B H (N c) d -> B H N c d", c=chunk)
    qgt_c = rearrange(qgt, "B (H g) d (N c) -> B H g N d c", g=g, c=chunk)
    tokens = lambda x: rearrange(x, "B H (N c) -> B H N c", c=chunk)
    den_read_c = rearrange(den_read, "B (H g) (N c) -> B H g N c", g=g, c=chunk)
    S_c = rearrange(S_before, "B H (N a b) e -> B H N a b e", a=d, b=d)
    f = lambda *x: _chunk_output(*x, scale)
    over_chunks = jax.vmap(f)  # N
    over_heads = jax.vmap(over_chunks, in_axes=(0, 0, 0, None, None, None, None, 0, None))  # g
    y, den = jax.vmap(jax.vmap(over_heads))(
        per_q(qg), qgt_c, per_q(q), per_kv(k), per_kv(v), tokens(F), tokens(R), den_read_c, S_c
    )
    return rearrange(y, "B H g N c e -> B (H g) (N c) e"), rearrange(den, "B H g N c -> B (H g) (N c)")
