"""Pallas kernels for power retention of degree 2: chunked forward and backward, and the decode state pass.

A leaf library: arrays in, arrays out (it imports nothing from `retention`). Entry points:
- `chunked_retention(q, k, v, log_g, S_exp, Z, *, scale, chunk_size, ...) -> (y, S_exp, Z)`, differentiable in
  every input (chunked.py, its VJP in vjp.py);
- `decode_state_pass(q_t, k_t, v, gamma, S, ...) -> (read, S)`: the pass over the exact state of a decode step
  (decode.py), forward only;
- `check_supported(deg, d, g, backend, chunk)`: what the kernels support; `BlockSizes` and `default_block_sizes`:
  block sizes and compiler settings per backend; `resolve_backend`, `matmul_precision`, `lowering_for` (a target
  for lowering from another machine) (config.py).

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
   with the rows in registers. It saves every chunk-boundary state (N * d^2 * e * 4 bytes per head: 1 MiB per
   chunk at d = 64, twice the symmetric form);
2. output (output_kernel.py): intra-chunk attention fused with the read of the carried state and the
   normalisation, fully parallel over (B, Hq, chunks).
The backward (vjp.py) keeps those boundary states (no recomputation), runs the same state pass in reverse on
(q, dy / den) for the state gradients, then the gradient kernel (gradient_kernel.py), parallel over chunks. Z is
scanned by XLA. Decode (decode.py) reads and updates S in its exact symmetric layout in one pass. The per-chunk
arithmetic is shared (chunk_math.py); block sizes and compiler settings per backend are in config.py.
"""

from pallas_kernels.power_retention.chunked import chunked_retention
from pallas_kernels.power_retention.config import (
    BlockSizes,
    candidate_block_sizes,
    check_supported,
    chunk_for,
    default_block_sizes,
    lowering_for,
    lowering_target,
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
    "lowering_for",
    "lowering_target",
    "matmul_for",
    "matmul_precision",
    "resolve_backend",
    "resolve_interpret",
    "write_tuned",
]
