"""Per-backend settings of the power-retention kernels: block sizes, the backend choice and the matmul precision.

`BlockSizes.state_rows`: how many rows a of the expanded [d, d, e] state (layout.py) one state-pass program (GPU)
or grid step (TPU) carries; on GPU they live in registers for the whole chunk loop (rows * d * e * 4 bytes <= 64
KiB by default), on TPU in a VMEM scratch. `read_rows`: rows per grid step of the read and gradient kernels, whose
last grid axis is a reduction over row blocks on TPU; on GPU it must be all d rows (None), looped in one program.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

BACKENDS = ("gpu", "tpu")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Rows of the expanded [d, d, e] state per program or grid step (None: all d rows), and Triton's warps and
    pipeline stages (ignored on TPU)."""

    state_rows: int | None
    read_rows: int | None
    num_warps: int = 8
    num_stages: int = 2

    def rows(self, d: int) -> tuple[int, int]:
        """(state_rows, read_rows) resolved for head dim d; each must divide d."""
        out = []
        for name, r in (("state_rows", self.state_rows), ("read_rows", self.read_rows)):
            r = d if r is None else min(r, d)
            if d % r:
                raise ValueError(f"BlockSizes.{name} must divide the head dim d={d}, got {r}")
            out.append(r)
        return out[0], out[1]


def default_block_sizes(backend: str, d: int) -> BlockSizes:
    """GPU: state rows so that rows * d * d * 4 bytes <= 64 KiB (registers of 8 warps), reads loop over all d rows in
    one program with 2 pipeline stages. TPU: 8 state rows per VMEM block (512 KiB at d = 128) and 16 rows per read
    step. Untuned: no GPU or TPU was at hand when they were chosen."""
    if backend == "gpu":
        return BlockSizes(state_rows=max(1, 16384 // (d * d)), read_rows=None)
    return BlockSizes(state_rows=8, read_rows=16)


def resolve_backend(backend: str | None) -> str:
    """'gpu' or 'tpu': the given one, or the default device's ('gpu' on CPU, where kernels run interpreted)."""
    if backend is None:
        return "tpu" if jax.default_backend() == "tpu" else "gpu"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}")
    return backend


def resolve_interpret(interpret: bool | None) -> bool:
    """None means interpret mode exactly when the default device is a CPU."""
    return jax.default_backend() == "cpu" if interpret is None else bool(interpret)


def matmul_precision(dtype) -> jax.lax.Precision:
    """float32 inputs: exact float32 matmuls (HIGHEST; Triton's DEFAULT would be TF32); bf16 inputs: DEFAULT
    (TF32 on GPU, one bf16 pass on TPU), well inside the bf16 tolerance."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT


def compiler_params(backend: str, blocks: BlockSizes, semantics: tuple[str, ...]):
    """Mosaic parameters (grid axes' `semantics`) on TPU; Triton's warps and stages from `blocks` on GPU."""
    if backend == "tpu":
        return pltpu.CompilerParams(dimension_semantics=semantics)
    return pltriton.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages)
