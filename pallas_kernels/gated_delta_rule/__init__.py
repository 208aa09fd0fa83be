"""Pallas kernels for the chunked gated delta rule (Gated DeltaNet), forward and backward: the chunks' WY/UT operands
and the sequential pass over chunks.

A leaf library like `pallas_kernels.power_retention` (whose block settings, matmul helpers and backend choice it
reuses): arrays in, arrays out. Entry points (chunked.py), each under its VJP and differentiable in every input but
the reset counts:
- `chunk_operands(q, k, v, beta, F, R) -> (A, W, U)`: per chunk (operands.py, wy_math.py);
- `chunked_delta(q~, A, W, U, k_out, gamma, S0) -> (o, S)`: the pass over chunks (vjp.py, sequential.py,
  chunk_step.py);
- `check_supported` (pallas_kernels/matrix_state.py, shared with GLA's): what they support.

S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = scale S_t^T q_t. By the WY/UT form
(retention/ops/gated_delta_rule/chunked.py), per chunk of c tokens (F the cumulative log-gates, R the reset counts,
D_ij = exp(F_i - F_j) for j <= i in one document): L = strictly_lower(beta_i (k_i . k_j) D_ij),
(I + L) U = beta v, (I + L) W = beta exp(F) k (0 after the chunk's first reset), A = Q K^T * D. Those are S-free, so
the operands kernel runs fully parallel over (B, H, chunks), the unit-triangular systems solved by substitution one
row per step inside the program (its backward by back substitution). What remains is sequential:
U~ = U - W S, o = q~ S + A U~, S' = gamma S + k_out^T U~ (q~ = q exp(F) before the chunk's first reset, k_out the
keys of the chunk's last document decayed to its end, gamma the chunk decay; made by the caller's XLA, elementwise),
one kernel over the chunks in order with the state on chip, saving the state entering every chunk; the backward is
the same kernel in reverse from those states.

Cost per kv-head and chunk (g = 1, d_k = d_v = d): operands about 2 c^2 d (K K^T, Q K^T) + c^2 (2 d) (the two
substitutions, elementwise, c sequential steps) FLOPs, backward about 3x; the pass 8 c d^2 + 2 c^2 d forward, about
twice that backward; state traffic d^2 * 4 bytes per chunk written forward and read backward; A, W and U go
through memory between the two kernels (the XLA path's layout). Unmeasured on a GPU or TPU (no device run yet).
"""

from pallas_kernels.gated_delta_rule.chunked import chunk_operands, chunked_delta
from pallas_kernels.matrix_state import check_supported

__all__ = ["check_supported", "chunk_operands", "chunked_delta"]
