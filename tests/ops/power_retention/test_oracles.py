"""The oracles the paths are checked against (tests/ops/cases.py), checked themselves, in float64: the quadratic
reference against the direct sum (plain numpy loops) and against finite differences; the token-by-token recurrence
against the direct sums for its outputs and final state, against finite differences, and against the quadratic
reference (outputs and gradients) on the case table."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retention import power_retention_reference, sympow
from retention.ops.power_retention.reference import power_retention_recurrence
from tests.helpers import f64, random_qkv, rel_err
from tests.ops.cases import PREFIX, case_ids, inputs, oracle, segment_ids

# The reference adds 1e-7 inside the log and 1e-6 to the normaliser (DESIGN section 1): its outputs agree with the
# exact formula to about 1e-6, far below the paths' tolerance (2e-5). Its gradients move more where one key
# dominates a row (strong gates: the epsilons then perturb a gradient that is itself small; 4e-5 on the strong
# case of the table): that is why the paths' gradients are checked against the exact recurrence instead.
REFERENCE_FLOOR = 1e-5
EXACT = 1e-10  # two exact float64 evaluations of the same formula


def _direct(q, k, v, log_g, deg):
    """y_i = sum_{j<=i} (scale q_i.k_j)^p exp(G_i - G_j) v_j / sum_j (...), and the final state read through the
    probe `read(x) = sum_j (x.k_j)^p exp(G_T - G_j) [v_j | 1]`, by loops over numpy float64 arrays."""
    q, k, v, log_g = (np.asarray(x, np.float64) for x in (q, k, v, log_g))
    B, T, Hq, d = q.shape
    H = k.shape[2]
    g = Hq // H
    G = np.cumsum(log_g, axis=1)
    y = np.zeros(q.shape)
    for b, i, t in itertools.product(range(B), range(Hq), range(T)):
        h = i // g
        w = [(d**-0.5 * q[b, t, i] @ k[b, j, h]) ** deg * np.exp(G[b, t, h] - G[b, j, h]) for j in range(t + 1)]
        y[b, t, i] = np.array(w) @ v[b, : t + 1, h] / sum(w)

    def read(x_Pd):
        out = np.zeros((B, H, len(x_Pd), d + 1))
        for b, h, j in itertools.product(range(B), range(H), range(T)):
            decay = np.exp(G[b, T - 1, h] - G[b, j, h])
            out[b, h] += np.outer((x_Pd @ k[b, j, h]) ** deg * decay, np.append(v[b, j, h], 1.0))
        return out

    return y, read


@pytest.mark.parametrize("deg,gate", [(2, "mild"), (4, "strong"), (2, None)])
def test_reference_is_the_direct_sum(deg, gate):
    q, k, v, log_g = f64(*random_qkv(deg, 2, 7, 4, 2, 3, gate=gate))
    log_g = jnp.zeros(k.shape[:3], jnp.float64) if log_g is None else log_g
    y_direct, _ = _direct(q, k, v, log_g, deg)
    assert rel_err(power_retention_reference(q, k, v, log_g, deg=deg), y_direct) < REFERENCE_FLOOR


@pytest.mark.parametrize("deg", [2, 4])
def test_recurrence_is_the_direct_sum(deg):
    """Outputs, and the final state read by more probe vectors than it has feature rows (so the probes fix it
    entirely), from an initial state: the recurrence over a first part, continued over the rest."""
    q, k, v, log_g = f64(*random_qkv(10 + deg, 2, 9, 4, 2, 3, gate="mild"))
    y_direct, read = _direct(q, k, v, log_g, deg)
    first, rest = zip(*[(x[:, :4], x[:, 4:]) for x in (q, k, v, log_g)])
    y_first, state = power_retention_recurrence(*first, deg=deg)
    y_rest, state = power_retention_recurrence(*rest, state, deg=deg)
    assert rel_err(jnp.concatenate([y_first, y_rest], axis=1), y_direct) < EXACT
    probes = np.asarray(jax.random.normal(jax.random.key(deg), (2 * state.z.shape[-1], 3), jnp.float64))
    phi = np.asarray(sympow(jnp.asarray(probes), deg))  # [P, D]
    got = np.einsum("pD,bhDe->bhpe", phi, np.concatenate([state.S, state.z[..., None]], axis=-1))
    assert rel_err(got, read(probes)) < EXACT


@pytest.mark.parametrize("case", case_ids(lambda case: not (case.docs and case.init), packed=True))
def test_recurrence_matches_the_reference(case):
    """On the case table, the outputs `check_path` compares: the recurrence's from the (float32) initial state, the
    reference's over prefix + sequence (packed: each document alone; a packed case from a state has no reference)."""
    y_ref, (y, _, _) = oracle(case)
    assert rel_err(y, y_ref) < REFERENCE_FLOOR


@pytest.mark.parametrize("case", case_ids(lambda case: case.docs and not case.init, packed=True))
def test_packed_oracles_equal_the_documents_alone(case):
    """The reference and the recurrence take segment_ids (or -inf gates) themselves: on the packed sequence they
    give the rows of the documents run alone, in float64."""
    (q, k, v, log_g, _), _ = inputs(case)
    y_alone, (y_rec_alone, _, _) = oracle(case)
    seg = segment_ids(case)
    y_ref = power_retention_reference(*f64(q, k, v, log_g), segment_ids=seg, deg=case.deg)
    y_rec, _ = power_retention_recurrence(*f64(q, k, v, log_g), segment_ids=seg, deg=case.deg)
    assert rel_err(y_ref, y_alone) < EXACT
    assert rel_err(y_rec, y_rec_alone) < EXACT


@pytest.mark.parametrize("case", case_ids(lambda case: case.init and case.Hq > case.H and case.gate == "mild"))
def test_recurrence_gradients_match_the_reference(case):
    """The gradients of <y, ct> in float64 (on the GQA cases with a state and mild gates, degrees 2 and 4: where the
    reference's epsilons stay small). The initial state is the recurrence's over the prefix, exactly."""
    (q, k, v, log_g, _), prefix = inputs(case)
    ct = jax.random.normal(jax.random.key(case.T), q.shape, jnp.float64)

    def recurrence(*x):
        state = power_retention_recurrence(*f64(*prefix), deg=case.deg)[1]
        return power_retention_recurrence(*x, state, deg=case.deg)[0]

    def reference(*x):
        full = [jnp.concatenate([p, a], axis=1) for p, a in zip(f64(*prefix), x)]
        return power_retention_reference(*full, deg=case.deg)[:, PREFIX:]

    grads, grads_ref = (
        jax.jit(jax.grad(lambda *x, fn=fn: jnp.vdot(fn(*x), ct), (0, 1, 2, 3)))(*f64(q, k, v, log_g))
        for fn in (recurrence, reference)
    )
    for name, a, b in zip("q k v log_g".split(), grads, grads_ref):
        assert rel_err(a, b) < REFERENCE_FLOOR, name


def _check_finite_differences(loss, args, seed):
    """Each gradient of `loss` at `args`, projected on a random direction, against central differences."""
    loss = jax.jit(loss)
    grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)
    eps = 1e-6
    for i, g in enumerate(grads):
        direction = jax.random.normal(jax.random.key(seed + i), args[i].shape, jnp.float64)
        plus = [a + eps * direction if j == i else a for j, a in enumerate(args)]
        minus = [a - eps * direction if j == i else a for j, a in enumerate(args)]
        numeric = (loss(*plus) - loss(*minus)) / (2 * eps)
        np.testing.assert_allclose(jnp.sum(g * direction), numeric, rtol=1e-6)


def test_reference_gradient_matches_finite_differences():
    q, k, v, log_g = f64(*random_qkv(4, 1, 6, 2, 1, 3, gate="mild"))
    cot = jax.random.normal(jax.random.key(5), q.shape, jnp.float64)
    _check_finite_differences(lambda *a: jnp.sum(power_retention_reference(*a, deg=2) * cot), [q, k, v, log_g], 10)


def test_recurrence_gradient_matches_finite_differences():
    """Gradients of outputs and final state, the initial state's included."""
    q, k, v, log_g = f64(*random_qkv(6, 1, 9, 2, 1, 3, gate="strong"))
    _, state0 = power_retention_recurrence(q[:, :4], k[:, :4], v[:, :4], log_g[:, :4], deg=4)
    cts = [jax.random.normal(jax.random.key(i), x.shape, jnp.float64) for i, x in enumerate((q, *state0))]

    def loss(q, k, v, log_g, S0, z0):
        y, state = power_retention_recurrence(q, k, v, log_g, type(state0)(S0, z0), deg=4)
        return sum(jnp.sum(x * ct) for x, ct in zip((y, *state), cts))

    _check_finite_differences(loss, [q, k, v, log_g, *state0], 20)
