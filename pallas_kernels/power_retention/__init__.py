"""Pallas kernels for power retention of degree 2: chunked forward and backward, and the decode state pass.

A leaf library: arrays in, arrays out (it imports nothing from `retention`). Entry points:
- `chunked_retention(q, k, v, F, R, S_exp, Z, *, scale, chunk_size, ...) -> (y, S_exp, Z)` (F, R [B, T, H]: within
  each chunk, the inclusive sum of the log-gates and the count of resets, as the op's gates.py makes them),
  differentiable in every input but R (chunked_retention.py, its VJP in vjp.py);
- `decode_state_pass(q_t, k_t, v, gamma, S, ...) -> (read, S)`: the pass over the exact state of a decode step
  (decode.py), forward only;
- `check_supported(deg, d, g, backend, chunk)`: what the kernels support; `BlockSizes` and `default_block_sizes`:
  block sizes and compiler settings per backend; `resolve_backend`, `matmul_precision` (config.py).

The expanded state. For p = 2, (x . y)^2 = sum_{a,b} x_a x_b y_a y_b, so the chunked kernels use the feature x (x) x
(all d*d products) instead of the symmetric power map (the D = d(d+1)/2 products a <= b, times sqrt(2) off the
diagonal). The state is S_exp[a, b, :] = sum_j k_ja k_jb v_j, [d, d, e], symmetric in (a, b), and the normaliser's
Z[a, b] = sum_j k_ja k_jb, [d, d]. Row a of S_exp is a [d, e] matrix, and the read of one row is the matmul
(x * x_a) @ S_exp[a]: every kernel works on rows, so no array has the odd size D (Triton needs powers of two) and
no kernel needs a gather. It costs twice the FLOPs and memory of the symmetric form; converting to and from a
caller's own state layout is the caller's.

Design. The forward runs in two passes:
1. state pass (state_pass.py): the only sequential part, over chunks, parallel over (B, H, blocks of state rows);
   TPU: chunk axis last in the grid with the rows in a VMEM scratch; GPU: a loop over chunks inside each program
   with the rows in registers. It saves every chunk-boundary state in the matmul operand dtype (N * d^2 * e * b
   bytes per head, b = 2 for bf16 inputs: 512 KiB per chunk at d = 64, the symmetric form's float32 size);
2. output (output_kernel.py): intra-chunk attention fused with the read of the carried state and the
   normalisation, fully parallel over (B, Hq, chunks).
On GPU the two forward passes have a second implementation on Mosaic GPU (mosaic_forward.py, Hopper's wgmma
and TMA; `BlockSizes.forward="mosaic"`, bf16 or fp16 inputs, d and the chunk multiples of 64), its block arithmetic
in mosaic_blocks.py and a jnp emulation of it for the CPU in mosaic_emulation.py; the default stays Triton until
the Mosaic one is measured faster on a device.
The backward (vjp.py) keeps those boundary states (no recomputation), runs the same state pass in reverse on
(q, dy / den) for the state gradients, then the gradient kernel (gradient_kernel.py), parallel over chunks. Z is
scanned by XLA. Decode (decode.py) reads and updates S in its exact symmetric layout in one pass. The per-chunk
arithmetic is shared (kernel_math.py); block sizes and compiler settings per backend are in config.py.

Cost per pass, per kv-head with one query head (g = 1), T tokens in N = T / c chunks, d = e, operands of b bytes
(FLOPs counted as 2 per multiply-add; q, k, v reads of O(T d b) bytes left out):
- forward state pass: 2 T d^2 e FLOPs (phi(k~)^T v); writes N d^2 e b bytes;
- output kernel: 2 T d^2 e (phi(q~) S) + 2 T c (d + e) (intra-chunk scores and values); reads N d^2 e b;
- backward state pass: 2 T d^2 e; writes N d^2 e b (dS per chunk);
- gradient kernel: 6 T d^2 e (dq from S, dk and dv from dS) + about 4 T c (d + e) intra-chunk; reads 2 N d^2 e b.
Forward+backward: about 12 T d^2 e FLOPs and 5 N d^2 e b bytes. At T = 64k, H = 8, d = 64, c = 128, bf16 (b = 2):
1.7e12 FLOPs (2.1 ms at ~790 TFLOP/s on an H200) and 10.7 GB of state traffic (2.2 ms at ~4.8 TB/s); before
the bf16 operands (b = 4, TF32 matmuls at best) 21.5 GB (4.5 ms) and the same FLOPs at about half the rate. The
expanded state doubles both against the symmetric form; recomputing the boundary states in the backward instead
of saving them would cut the bytes to 3 N d^2 e b for 2 T d^2 e more FLOPs (not done: unmeasured).
"""

from pallas_kernels.power_retention.chunked_retention import chunked_retention
from pallas_kernels.power_retention.config import (
    BlockSizes,
    candidate_block_sizes,
    check_supported,
    chunk_for,
    default_block_sizes,
    matmul_for,
    matmul_precision,
    resolve_backend,
    resolve_interpret,
    write_tuned,
)
from pallas_kernels.power_retention.decode import decode_state_pass

__all__ = [
    "BlockSizes",
    "candidate_block_sizes",
    "check_supported",
    "chunk_for",
    "chunked_retention",
    "decode_state_pass",
    "default_block_sizes",
    "matmul_for",
    "matmul_precision",
    "resolve_backend",
    "resolve_interpret",
    "write_tuned",
]
