"""The symmetric power feature map: phi(x) . phi(y) == (x . y)^p for even degree p.

phi(x) lists the monomials of degree p in the entries of x (indices i1 <= ... <= ip, in lexicographic order), each
times sqrt(p! / prod(multiplicity!)). Its size is D = C(d + p - 1, p): 2080 for d = 64, p = 2.

It is built from slices and broadcast products, never a gather (a gather is several times slower on CPU): the
monomials of degree r whose smallest index is >= a are a contiguous suffix of those of degree r, so degree r is
the concatenation over i of x_i times the degree r-1 suffix that starts at i.
"""

from functools import cache
from itertools import combinations_with_replacement
from math import comb, factorial

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from retention.ops.power_retention.validation import check_deg


def sympow_dim(d: int, p: int) -> int:
    """The number of distinct monomials of degree p in d variables.

    Args:
        d: the head dim.
        p: the degree.

    Returns:
        D = C(d + p - 1, p).
    """
    return comb(d + p - 1, p)


@cache
def _suffix_offsets(d: int, r: int) -> tuple[int, ...]:
    """Where, in the degree-r monomial list, the monomials with smallest index >= a start (a = 0..d-1)."""
    lengths = [sympow_dim(d - i, r - 1) for i in range(d)]  # monomials of degree r with smallest index exactly i
    return tuple(int(o) for o in np.concatenate([[0], np.cumsum(lengths)[:-1]]))


@cache
def sympow_weights(d: int, p: int) -> np.ndarray:
    """sqrt of the multinomial coefficient of each monomial, in phi's order, shape [D], float64."""
    weights = []
    for idx in combinations_with_replacement(range(d), p):
        counts = np.bincount(idx)
        weights.append(factorial(p) / np.prod([factorial(int(c)) for c in counts]))
    return np.sqrt(np.asarray(weights, dtype=np.float64))


def sympow(x: Float[Array, "..."], p: int, axis: int = -1) -> Float[Array, "..."]:
    """phi(x), the symmetric power feature map: phi(x) . phi(y) == (x . y)^p.

    `axis=-2` builds the transposed map ([..., d, c] -> [..., D, c]) that a state write phi(K)^T V wants: on CPU
    that layout makes the write matmul about 25% faster than transposing [c, D] (experiments/PERF_LOG.md).

    Args:
        x: any array; `axis` has size d.
        p: the even degree >= 2.
        axis: the axis to expand.

    Returns:
        x's shape with `axis` grown from d to D = C(d + p - 1, p).
    """
    check_deg(p)
    axis = axis % x.ndim
    d = x.shape[axis]

    def take(a, start, stop=None):
        return jax.lax.slice_in_dim(a, start, a.shape[axis] if stop is None else stop, axis=axis)

    monomials = x  # degree 1
    for r in range(2, p + 1):
        offsets = _suffix_offsets(d, r - 1)
        monomials = jnp.concatenate([take(x, i, i + 1) * take(monomials, offsets[i]) for i in range(d)], axis=axis)
    weights = jnp.asarray(sympow_weights(d, p), dtype=x.dtype)
    return monomials * jnp.expand_dims(weights, tuple(range(1, x.ndim - axis)))
