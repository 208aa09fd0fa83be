"""Pallas kernels for power retention (degree 2): chunked forward and backward, and decode.

Entry points, called by retention/ops/power_retention.py after validation:
- `power_retention_pallas(q, k, v, log_g, initial_state, *, deg, scale, chunk_size, ...) -> (y, RetentionState)`;
- `power_retention_step_pallas(state, q, k, v, log_g, *, deg, scale, ...) -> (y, RetentionState)`.
Both are differentiable in q, k, v, log_g and the state (the step's gradient comes from the XLA step).

Design. The kernels carry the expanded state S_exp [d, d, e] (layout.py: row a is a [d, e] matmul operand, so no
array has the odd size D = 2080 and Triton's power-of-two rule holds); the public state is converted at the
boundary. The forward runs in two passes:
1. state pass (state_pass.py): the only sequential part, over chunks, parallel over (B, H, blocks of state rows);
   TPU: chunk axis last in the grid with the rows in a VMEM scratch; GPU: a loop over chunks inside each program
   with the rows in registers. It saves every chunk-boundary state (N * d^2 * e * 4 bytes per head: 1 MiB per
   chunk at d = 64, twice the symmetric form);
2. read (read.py): intra-chunk attention fused with the read of the carried state and the normalisation, fully
   parallel over (B, Hq, chunks).
The backward (forward_backward.py) keeps those boundary states (no recomputation), runs the same state pass in
reverse on (q, dy / den) for the state gradients, then the gradient kernel (grads.py), parallel over chunks. The
normaliser's state z is kept as a d x d matrix Z (d times smaller than S) and scanned by XLA. Decode (decode.py)
reads and updates S in its exact layout in one pass. The per-chunk arithmetic is shared (chunk_math.py); block
sizes per backend are in config.py.
"""

from pallas_kernels.power_retention.config import BlockSizes, default_block_sizes
from pallas_kernels.power_retention.decode import power_retention_step_pallas
from pallas_kernels.power_retention.forward import power_retention_pallas

__all__ = ["BlockSizes", "default_block_sizes", "power_retention_pallas", "power_retention_step_pallas"]
