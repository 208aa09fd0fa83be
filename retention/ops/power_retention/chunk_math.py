"""The per-chunk arithmetic of power retention in XLA, shared by the chunked path, the decode step, context
parallelism and the token recurrence (the Pallas kernels have their own, in
`pallas_kernels/power_retention/kernel_math.py`).

Within a chunk (tokens on the last axis of F and R, from `gates.chunk_gates`: F the cumulative log-gate, R
the count of resets so far, F_end and R_end their last entries), the reset contract:
- intra-chunk decay(i, j) = exp(F_i - F_j) if R_i == R_j, else 0 (j <= i);
- query i reads the state carried into the chunk as phi(q exp(F_i/p)) if R_i == 0, else not at all;
- key j enters the state carried out as phi(k exp((F_end - F_j)/p)) if R_j == R_end, else not at all;
- the carried state decays by exp(F_end) if R_end == 0, else it is dropped.
Gates enter as exp(F/p) factors on q and k, exact because phi is p-homogeneous; every exponent is <= 0, so nothing
overflows at any length. Masks are `where`s, never products with 0, so a NaN stays in the rows that see it.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from retention.ops.power_retention.sympow import sympow


def masked_exp(x, mask):
    """exp(x) where mask, else 0; the exponent is masked too, so an unselected inf or NaN reaches no gradient."""
    return jnp.where(mask, jnp.exp(jnp.where(mask, x, 0.0)), 0.0)


def gate_factors(F: Float[Array, "... c"], R: Int[Array, "... c"], deg: int):
    """(query factors [..., c], key factors [..., c], chunk decay [...]) of the module docstring: exp(F/p) where
    R == 0, exp((F_end - F)/p) where R == R_end, exp(F_end) where R_end == 0; 0 elsewhere."""
    F_end, R_end = F[..., -1:], R[..., -1:]
    decay = masked_exp(F_end, R_end == 0)[..., 0]
    return masked_exp(F / deg, R == 0), masked_exp((F_end - F) / deg, R == R_end), decay


def causal_decay(F: Float[Array, "... c"], R: Int[Array, "... c"]) -> Float[Array, "... c c"]:
    """exp(F_i - F_j) for j <= i in one document (R_i == R_j), else 0."""
    c = F.shape[-1]
    mask = jnp.tril(jnp.ones((c, c), dtype=bool)) & (R[..., :, None] == R[..., None, :])
    return masked_exp(F[..., :, None] - F[..., None, :], mask)


def decay_state(decay: Float[Array, "B H"], x: Float[Array, "B H ..."]) -> Float[Array, "B H ..."]:
    """decay * x, with a decay of 0 (a reset) dropping x outright, NaN included."""
    decay = decay.reshape(decay.shape + (1,) * (x.ndim - decay.ndim))
    return jnp.where(decay == 0, 0.0, decay * x)


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
