"""One chunk of the gated delta rule's sequential pass, forward and backward, on its S-free operands (the caller's
XLA makes them, one triangular solve per chunk; retention/ops/gated_delta_rule/chunked.py):
    U~ = U - W S,   o_r = q~_r S + A_r U~ (each query head r of the kv-head),   S' = gamma S + k_out^T U~,
a chunk decay gamma of 0 dropping S outright (a reset, NaN included). The backward, from dS' and dO:
    dU~ = k_out dS' + sum_r A_r^T dO_r,  dq~_r = dO_r S^T,  dA_r = dO_r U~^T,  dk_out = U~ dS'^T,  dW = -dU~ S^T,
    dgamma = sum(dS' * S) (0 where gamma is 0),  dS = gamma dS' + sum_r q~_r^T dO_r - W^T dU~,
with U~ recomputed from the saved S. Chunk inputs and outputs are read and written through `sequential.py`'s
load and store.
"""

import jax.numpy as jnp

from pallas_kernels.power_retention.kernel_math import F32, Matmul, dot

# chunk inputs of the forward: q~ [g, c, d_k], A [g, c, c], W [c, d_k], U [c, d_v], k_out [c, d_k], gamma [1, 1]
Q, A, W, U, K_OUT, GAMMA = range(6)
# ... and of the backward: those, then S_before [d_k, d_v], dO [g, c, d_v]
S_BEFORE, DO = 6, 7


def _decayed(gamma, S):
    return jnp.where(gamma == 0, 0.0, gamma * S)


def forward_step(load, store, S, *, g: int, mm: Matmul):
    """Outputs o (chunk output 0, [g, c, d_v]) and the state entering the chunk (output 1); returns S'."""
    store(1, S)
    W_, U_, k_out = (load(i).astype(F32) for i in (W, U, K_OUT))
    U_t = U_ - dot(W_, S, mm)
    for r in range(g):
        store(0, dot(load(Q, r), S, mm) + dot(load(A, r), U_t, mm), r)
    return _decayed(load(GAMMA), S) + dot(k_out, U_t, mm, trans_x=True)


def backward_step(load, store, dS, *, g: int, mm: Matmul):
    """Outputs dq~ [g, c, d_k], dA [g, c, c], dW, dU, dk_out and dgamma [1, 1] (chunk outputs 0-5); returns the
    gradient of the state entering the chunk."""
    S = load(S_BEFORE)
    W_, U_, k_out, gamma = (load(i).astype(F32) for i in (W, U, K_OUT, GAMMA))
    U_t = U_ - dot(W_, S, mm)
    dU = dot(k_out, dS, mm)
    dS_in = _decayed(gamma, dS)
    for r in range(g):
        q, A_, do = load(Q, r), load(A, r), load(DO, r)
        dU = dU + dot(A_, do, mm, trans_x=True)
        store(0, dot(do, S, mm, trans_y=True), r)
        store(1, dot(do, U_t, mm, trans_y=True), r)
        dS_in = dS_in + dot(q, do, mm, trans_x=True)
    store(2, -dot(dU, S, mm, trans_y=True))
    store(3, dU)
    store(4, dot(U_t, dS, mm, trans_y=True))
    total = jnp.sum(jnp.sum(dS * S, axis=1, keepdims=True), axis=0, keepdims=True)
    store(5, jnp.where(gamma == 0, 0.0, total))
    return dS_in - dot(W_, dU, mm, trans_x=True)
