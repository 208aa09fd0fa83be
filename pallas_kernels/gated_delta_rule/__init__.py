"""Pallas kernels for the chunked gated delta rule (Gated DeltaNet): its sequential pass over chunks, forward and
backward.

A leaf library like `pallas_kernels.power_retention` (whose block settings, matmul helpers and backend choice it
reuses): arrays in, arrays out. Entry point: `chunked_delta(q~, A, W, U, k_out, gamma, S0, ...) -> (o, S)`
(chunked.py), under its VJP (vjp.py), differentiable in every input; `check_supported` (pallas_kernels/
matrix_state.py, shared with GLA's) says what it supports.

S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = scale S_t^T q_t. By the WY/UT form
(retention/ops/gated_delta_rule/chunked.py), each chunk has S-free operands: q~, A = Q K^T * D, W, U, the keys
decayed to the chunk's end k_out and the chunk decay gamma, made by the caller's XLA batched over all chunks (one
unit-triangular solve per chunk); what remains is sequential, U~ = U - W S, o = q~ S + A U~, S' = gamma S +
k_out^T U~ (chunk_step.py). That pass is the kernel (sequential.py: parallel over (B, H), the chunks in order
inside one kernel, the state on chip), saving the state entering every chunk; the backward is the same pass in
reverse, from those states, giving every operand's gradient, whose chain rule through the solve is XLA's.

What is not in a kernel: the triangular solve and the S-free products (XLA, batched over chunks: they are
parallel, and the XLA path runs them the same way). Cost per kv-head and chunk (g = 1, d_k = d_v = d): forward
2 c d^2 (W S) + 2 c d^2 (q~ S) + 2 c^2 d (A U~) + 2 c d^2 (k_out^T U~) FLOPs, backward about twice that; state
traffic d^2 * 4 bytes per chunk written forward and read backward. Unmeasured on a GPU or TPU (no device run yet).
"""

from pallas_kernels.gated_delta_rule.chunked import chunked_delta
from pallas_kernels.matrix_state import check_supported

__all__ = ["check_supported", "chunked_delta"]
