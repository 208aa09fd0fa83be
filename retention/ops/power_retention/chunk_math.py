"""The per-chunk arithmetic of power retention in XLA, shared by the chunked path, the decode step, context
parallelism and the token recurrence (the Pallas kernels have their own, in
`pallas_kernels/power_retention/kernel_math.py`).

F and R come from `gates.chunk_gates`; the decay and reset masks (the reset contract) are `retention/ops/decay.py`'s,
shared with the matrix-state ops. Gates enter as exp(F/p) factors on q and k, exact because phi is p-homogeneous.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from retention.ops.decay import causal_decay
from retention.ops.power_retention.sympow import sympow


def intra_chunk(
    q_BHgcd: Float[Array, "B H g c d"],
    k_BHcd: Float[Array, "B H c d"],
    v_BHce: Float[Array, "B H c e"],
    F_BHc: Float[Array, "B H c"],
    R_BHc: Int[Array, "B H c"],
    deg: int,
) -> Float[Array, "B H g c e"]:
    """The quadratic form inside one chunk, (q_i . k_j)^p decay(i, j) for j <= i, times v (q already scaled, k and
    v finite): with v = [v | 1] the numerator columns, then the normaliser."""
    scores = jnp.einsum("bhgid,bhjd->bhgij", q_BHgcd, k_BHcd) ** deg
    return jnp.einsum("bhgij,bhje->bhgie", scores * causal_decay(F_BHc, R_BHc)[:, :, None], v_BHce)


def state_read(q_BHmd: Float[Array, "B H m d"], S_BHDe: Float[Array, "B H D e"], deg: int) -> Float[Array, "B H m e"]:
    """phi(q) S: each of the m query rows read against the state."""
    return jnp.einsum("bhmD,bhDe->bhme", sympow(q_BHmd, deg), S_BHDe)


def state_write(k_BHcd: Float[Array, "B H c d"], u_BHce: Float[Array, "B H c e"], deg: int) -> Float[Array, "B H D e"]:
    """phi(k)^T u: the c keys' addition to the state (phi built transposed, [D, c]: see sympow)."""
    return jnp.einsum("bhDc,bhce->bhDe", sympow(jnp.swapaxes(k_BHcd, -1, -2), deg, axis=-2), u_BHce)


def normalise(y_aug: Float[Array, "... e"]) -> Float[Array, "... d"]:
    """Numerator columns over the last (normaliser) column. A row whose weights are all zero (every weight
    underflowed, or padding, which is cropped) gives NaN, never 0, with a NaN-free gradient (the `where` sends
    none to `_ratio` there); a NaN normaliser stays NaN. Differentiated as in `_ratio`."""
    den = y_aug[..., -1:]
    return jnp.where(den == 0, jnp.nan, _ratio(y_aug[..., :-1], den))


@jax.custom_jvp
def _ratio(num: Float[Array, "... d"], den: Float[Array, "... 1"]) -> Float[Array, "... d"]:
    """y = num / den where den > 0 or NaN, else 0."""
    divide = ~(den <= 0)  # positive or NaN
    return jnp.where(divide, num / jnp.where(divide, den, 1.0), 0.0)


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
