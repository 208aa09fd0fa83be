"""Per-backend settings of the power-retention kernels: block sizes and compiler settings, what the kernels support,
the backend choice and the matmul precision.

`BlockSizes.state_rows`: how many rows a of the expanded [d, d, e] state (see the package docstring) one state-pass
program (GPU) or grid step (TPU) carries; on GPU they live in registers for the whole chunk loop (rows * d * e * 4
bytes <= 64 KiB by default), on TPU in a VMEM scratch. `read_rows`: rows per grid step of the output and gradient
kernels, whose last grid axis is a reduction over row blocks on TPU; on GPU it must be all d rows (None), looped in
one program. `decode_cols`: columns of S per decode program (None: all e).
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

BACKENDS = ("gpu", "tpu")
SUPPORTED_DEGREES = (2,)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Rows of the expanded [d, d, e] state per program or grid step (None: all d rows), columns of S per decode
    program (None: all), and Triton's warps and pipeline stages for the chunked kernels and for decode (ignored on
    TPU)."""

    state_rows: int | None
    read_rows: int | None
    num_warps: int = 8
    num_stages: int = 2
    decode_cols: int | None = None
    decode_num_warps: int = 4
    decode_num_stages: int = 1

    def rows(self, d: int) -> tuple[int, int]:
        """(state_rows, read_rows) resolved for head dim d; each must divide d."""
        state_rows = _resolve("state_rows", self.state_rows, "the head dim d", d)
        return state_rows, _resolve("read_rows", self.read_rows, "the head dim d", d)

    def cols(self, e: int) -> int:
        """decode_cols resolved for e columns; it must divide e."""
        return _resolve("decode_cols", self.decode_cols, "the value columns e", e)


def _resolve(name: str, size: int | None, what: str, full: int) -> int:
    """`size` (None: all of `full`) capped at `full`; it must divide `full`."""
    size = full if size is None else min(size, full)
    if full % size:
        raise ValueError(f"BlockSizes.{name} must divide {what}={full}, got {size}")
    return size


def default_block_sizes(backend: str, d: int) -> BlockSizes:
    """GPU: state rows so that rows * d * d * 4 bytes <= 64 KiB (registers of 8 warps), reads loop over all d rows in
    one program with 2 pipeline stages, decode in blocks of 16 columns (4x more programs at e = 64: decode streams S
    once and wants many SMs) with 4 warps and 1 stage. TPU: 8 state rows per VMEM block (512 KiB at d = 128), 16 rows
    per read step, decode over all e lanes. Untuned: no GPU or TPU was at hand when they were chosen."""
    if backend == "gpu":
        return BlockSizes(state_rows=max(1, 16384 // (d * d)), read_rows=None, decode_cols=16)
    return BlockSizes(state_rows=8, read_rows=16)


def check_supported(deg: int, d: int, g: int, backend: str, chunk: int | None = None) -> None:
    """What the kernels support (degree, head dim d, query heads per kv-head g, chunk size on `backend`); raises
    NotImplementedError (degree) or ValueError naming the value and what is allowed."""
    if deg not in SUPPORTED_DEGREES:
        raise NotImplementedError(
            f"deg={deg}: the Pallas kernels support degrees {SUPPORTED_DEGREES} (the expanded degree-4 state, d^4 x d "
            f"floats, does not fit on chip); use impl='xla'"
        )
    pow2 = lambda n: n >= 1 and n & (n - 1) == 0
    if backend == "gpu":
        if not (pow2(d) and d >= 16):
            raise ValueError(f"head dim d={d}: Triton kernels need a power of two >= 16")
        if not pow2(g):
            raise ValueError(f"query heads per kv-head {g}: Triton kernels need a power of two")
        if chunk is not None and not (pow2(chunk) and chunk >= 16):
            raise ValueError(f"chunk_size={chunk}: Triton kernels need a power of two >= 16")
    elif chunk is not None and chunk % 8:
        raise ValueError(f"chunk_size={chunk}: TPU kernels need a multiple of 8")


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


def compiler_params(backend: str, blocks: BlockSizes, semantics: tuple[str, ...], *, decode: bool = False):
    """Mosaic parameters (grid axes' `semantics`) on TPU; Triton's warps and stages from `blocks` on GPU (the
    decode kernel's own with `decode`)."""
    if backend == "tpu":
        return pltpu.CompilerParams(dimension_semantics=semantics)
    if decode:
        return pltriton.CompilerParams(num_warps=blocks.decode_num_warps, num_stages=blocks.decode_num_stages)
    return pltriton.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages)
