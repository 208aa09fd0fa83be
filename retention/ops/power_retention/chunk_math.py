"""The per-chunk arithmetic of power retention in XLA, shared by the chunked path, the decode step and context
parallelism (the Pallas kernels have their own, in `pallas_kernels/power_retention/chunk_math.py`).

Within a chunk (tokens on the last axis of G): G is the inclusive cumsum of log_g from the chunk's start and
G_end its last entry; a query reads the state carried into the chunk as phi(q exp(G/p)), a key enters the state
carried out as phi(k exp((G_end - G)/p)), and that state decays by exp(G_end). Gates enter as exp(G/p) factors on
q and k, exact because phi is p-homogeneous; every exponent is <= 0, so nothing overflows at any length.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from retention.ops.power_retention.sympow import sympow


def gate_factors(G: Float[Array, "... c"], deg: int):
    """(query factors exp(G/p) [..., c], key factors exp((G_end - G)/p) [..., c], chunk decay exp(G_end) [...])."""
    G_end = G[..., -1]
    return jnp.exp(G / deg), jnp.exp((G_end[..., None] - G) / deg), jnp.exp(G_end)


def causal_decay(G: Float[Array, "... c"]) -> Float[Array, "... c c"]:
    """exp(G_i - G_j) for j <= i, else 0, from inclusive cumulative log-gates G (every exponent <= 0)."""
    c = G.shape[-1]
    causal = jnp.tril(jnp.ones((c, c), dtype=bool))
    return jnp.where(causal, jnp.exp(jnp.where(causal, G[..., :, None] - G[..., None, :], 0.0)), 0.0)


def intra_chunk(
    q_BHgcd: Float[Array, "B H g c d"],
    k_BHcd: Float[Array, "B H c d"],
    v_BHce: Float[Array, "B H c e"],
    G_BHc: Float[Array, "B H c"],
    deg: int,
) -> Float[Array, "B H g c e"]:
    """The quadratic form inside one chunk, (q_i . k_j)^p exp(G_i - G_j) for j <= i, times v (q already scaled):
    with v = [v | 1] the numerator columns, then the normaliser."""
    scores = jnp.einsum("bhgid,bhjd->bhgij", q_BHgcd, k_BHcd) ** deg
    return jnp.einsum("bhgij,bhje->bhgie", scores * causal_decay(G_BHc)[:, :, None], v_BHce)


def state_read(q_BHmd: Float[Array, "B H m d"], S_BHDe: Float[Array, "B H D e"], deg: int) -> Float[Array, "B H m e"]:
    """phi(q) S: each of the m query rows read against the state."""
    return jnp.einsum("bhmD,bhDe->bhme", sympow(q_BHmd, deg), S_BHDe)


def state_write(k_BHcd: Float[Array, "B H c d"], u_BHce: Float[Array, "B H c e"], deg: int) -> Float[Array, "B H D e"]:
    """phi(k)^T u: the c keys' addition to the state (phi built transposed, [D, c]: see sympow)."""
    return jnp.einsum("bhDc,bhce->bhDe", sympow(jnp.swapaxes(k_BHcd, -1, -2), deg, axis=-2), u_BHce)


def normalise(y_aug: Float[Array, "... e"]) -> Float[Array, "... d"]:
    """Numerator columns over the last (normaliser) column; a row whose weights are all zero (padding, or every
    weight underflowed) gives 0, and a NaN-free gradient, instead of 0/0. Differentiated as in `_ratio`."""
    return _ratio(y_aug[..., :-1], y_aug[..., -1:])


@jax.custom_jvp
def _ratio(num: Float[Array, "... d"], den: Float[Array, "... 1"]) -> Float[Array, "... d"]:
    """y = num / den where den > 0, else 0."""
    positive = den > 0
    return jnp.where(positive, num / jnp.where(positive, den, 1.0), 0.0)


@_ratio.defjvp
def _ratio_jvp(primals, tangents):
    """dy = (dnum - y dden) / den: the normaliser's derivative through y, which is bounded (a convex mix of values).
    JAX's own rule for a quotient, -dden num den^-2, overflows float32 once den < ~1e-19 although the true value
    is representable: at degree 4 the weights (scale q.k)^4 of a row whose query is nearly orthogonal to its keys
    reach that (the first token of an MQAR row trained for 175 steps: den = 1.4e-21), and the inf turns every
    gradient of the step into NaN."""
    num, den = primals
    dnum, dden = tangents
    y = _ratio(num, den)
    inv_den = _ratio(jnp.ones_like(den), den)
    return y, (dnum - y * dden) * inv_den
