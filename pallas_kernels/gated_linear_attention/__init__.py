"""Pallas kernels for chunked gated linear attention (GLA: a decay per key channel), forward and backward.

A leaf library like `pallas_kernels.power_retention` (whose block settings, matmul helpers and backend choice it
reuses): arrays in, arrays out. Entry points:
- `chunked_gla(q, k, v, F, R, f_q, f_k, gamma, S0, *, scale, chunk_size, ...) -> (o, S)` (chunked.py), under its
  VJP (vjp.py), differentiable in every input but R;
- `check_supported(d_k, d_v, g, chunk, backend)`: what the kernels support (pallas_kernels/matrix_state.py, shared
  with the gated delta rule's).

The recurrence is S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t. Per chunk of c tokens and
kv-head (the caller's gates, the reset contract of retention/ops/decay.py): F [c, d_k] the inclusive cumulative
log-gate per key channel from the chunk's start (a reset token's gate taken as 0), R the count of resets so far,
f_q = exp(F) where R == 0, f_k = exp(F_end - F) where R == R_end, gamma = exp(F_end) where R_end == 0 (0 elsewhere).
Then:
- across chunks: o_i += (q_i * f_q,i)^T S (the state carried in), and S <- diag(gamma) S + sum_j (k_j * f_k,j) v_j^T;
- inside the chunk: o_i += sum_j A_ij v_j, A_ij = sum_m q_im k_jm exp(F_im - F_jm) for j <= i in i's document,
  in sub-chunks of 16 tokens with every exponent <= 0 (intra.py).
Non-finite inputs are the caller's: k and v must be finite (the op zeroes bad tokens and puts NaN back by a mask).

Design. Three kernels, as the power-retention kernels are laid out:
1. state pass (state_pass.py): the only sequential part, over chunks, parallel over (B, H); it saves every
   chunk-boundary state (N d_k d_v float32 per head). The backward runs it in reverse on (q~, dO).
2. output (output_kernel.py): intra-chunk attention plus the read of the carried state, parallel over
   (B, Hq, chunks).
3. gradients (gradient_kernel.py): dq, dk, dv and the gradients of q~ and k~, parallel over (B, H, chunks), the
   g query heads of a kv-head in one program.
The gate factors (q~, k~, gamma) are formed by XLA from F and R, so their chain rule back to F is XLA's autodiff;
the kernels give F the intra-chunk part of its gradient (q . dq - k . dk).

Cost per kv-head and g = 1, T tokens, c-token chunks, d_k = d_v = d (FLOPs as 2 per multiply-add): each state pass
2 T d^2; output 2 T d^2 (the read) + about 2 T c d (intra-chunk: the earlier sub-chunk pairs as matmuls, the
diagonal ones elementwise); gradients 6 T d^2 (dq~, dk~, the state's share of dv) + about 3x the output's
intra-chunk part. State traffic: N d^2 * 4 bytes written per pass, read by the output and gradient kernels.
Unmeasured on a GPU or TPU (no device run yet).
"""

from pallas_kernels.gated_linear_attention.chunked import chunked_gla
from pallas_kernels.matrix_state import check_supported

__all__ = ["check_supported", "chunked_gla"]
