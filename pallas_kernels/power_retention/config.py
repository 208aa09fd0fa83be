"""Per-backend settings of the power-retention kernels: block sizes, chunk size and compiler settings (committed
defaults, a small candidate grid, and the tuned values `experiments/gpu_check.py` writes), what the kernels support,
the backend choice and the matmul operand dtype and precision.

`BlockSizes.state_rows`: how many rows a of the expanded [d, d, e] state (see the package docstring) one state-pass
program (GPU) or grid step (TPU) carries; on GPU they live in registers for the whole chunk loop (rows * d * e * 4
bytes <= 64 KiB by default), on TPU in a VMEM scratch. `read_rows`: rows per grid step of the output and gradient
kernels, whose last grid axis is a reduction over row blocks on TPU; on GPU it must be all d rows (None), looped in
one program. `decode_cols`: columns of S per decode program (None: all e). `forward`: the GPU
forward's kernels, "triton" (state_pass.py and output_kernel.py through Pallas Triton) or "mosaic"
(mosaic_forward.py: Mosaic GPU, Hopper's wgmma, bf16 or fp16 inputs; the backward stays the Triton one);
"triton" until the Mosaic one is measured faster on a device (a tuned entry may then set it). `chunk`: the chunk
size when the caller gives none (a shorter sequence takes the smallest power of two >= 16 that holds it: `chunk_for`).

Tuned values: `tuned_block_sizes.json` beside this file maps a device kind (`jax.devices()[0].device_kind`, e.g.
"NVIDIA H200") and a head dim to BlockSizes fields; `default_block_sizes` takes them on that device, the committed
defaults elsewhere or when the file is absent. `python -m experiments.gpu_check` writes it (`write_tuned`).
"""

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.power_retention.kernel_math import F32, Matmul

BACKENDS = ("gpu", "tpu")
FORWARD_KERNELS = ("triton", "mosaic")
SUPPORTED_DEGREES = (2,)
TUNED_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned_block_sizes.json")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Rows of the expanded [d, d, e] state per program or grid step (None: all d rows), columns of S per decode
    program (None: all), Triton's warps and pipeline stages for the chunked kernels and for decode (ignored on
    TPU), and the GPU forward's kernels (`forward`, module docstring)."""

    state_rows: int | None
    read_rows: int | None
    num_warps: int = 8
    num_stages: int = 2
    decode_cols: int | None = None
    decode_num_warps: int = 4
    decode_num_stages: int = 1
    chunk: int = 128
    forward: str = "triton"

    def __post_init__(self):
        if self.forward not in FORWARD_KERNELS:
            raise ValueError(f"BlockSizes.forward must be one of {FORWARD_KERNELS}, got {self.forward!r}")

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


def _committed_block_sizes(backend: str, d: int) -> BlockSizes:
    """GPU: state rows so that rows * d * d * 4 bytes <= 64 KiB (registers of 8 warps), reads loop over all d rows in
    one program with 2 pipeline stages, decode in blocks of 16 columns (4x more programs at e = 64: decode streams S
    once and wants many SMs) with 4 warps and 1 stage. TPU: 8 state rows per VMEM block (512 KiB at d = 128), 16 rows
    per read step, decode over all e lanes. Chunks of 128 on both. Chosen without a GPU or TPU at hand."""
    if backend == "gpu":
        return BlockSizes(state_rows=max(1, 16384 // (d * d)), read_rows=None, decode_cols=16)
    return BlockSizes(state_rows=8, read_rows=16)


@functools.cache
def _tuned(path: str) -> dict:
    """The tuned table {device kind: {str(d): BlockSizes fields}} at `path`, {} when absent."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _platform_backend(platform: str) -> str | None:
    return {"cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "tpu": "tpu"}.get(platform)


def default_block_sizes(backend: str, d: int, *, path: str = TUNED_PATH) -> BlockSizes:
    """The tuned BlockSizes of the default device for head dim d when `path` has them and that device runs
    `backend`; else the committed defaults (`_committed_block_sizes`)."""
    device = jax.devices()[0]
    entry = _tuned(path).get(device.device_kind, {}).get(str(d))
    if entry is not None and _platform_backend(device.platform) == backend:
        return BlockSizes(**entry)
    return _committed_block_sizes(backend, d)


def write_tuned(device_kind: str, d: int, blocks: BlockSizes, *, path: str = TUNED_PATH) -> None:
    """Record `blocks` as the tuned BlockSizes of `device_kind` at head dim d in `path` (other entries kept)."""
    table = dict(_tuned(path))
    table.setdefault(device_kind, {})[str(d)] = dataclasses.asdict(blocks)
    with open(path, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")
    _tuned.cache_clear()


def candidate_block_sizes(backend: str, d: int) -> list[BlockSizes]:
    """The small grid a tuning run sweeps, the committed defaults first. GPU: chunk 64, 128 or 256 x state rows
    half, equal to or twice the default x 4 or 8 warps (18); TPU: chunk 128, 256 or 512 x 8 or 16 state rows x 16
    or 32 read rows, capped at d (at most 12)."""
    base = _committed_block_sizes(backend, d)
    if backend == "gpu":
        rows = sorted({max(1, base.state_rows // 2), base.state_rows, min(d, 2 * base.state_rows)})
        grid = [
            dataclasses.replace(base, chunk=c, state_rows=r, num_warps=w)
            for c in (64, 128, 256)
            for r in rows
            for w in (4, 8)
        ]
    else:
        grid = [
            dataclasses.replace(base, chunk=c, state_rows=min(r, d), read_rows=min(rr, d))
            for c in (128, 256, 512)
            for r in (8, 16)
            for rr in (16, 32)
        ]
    unique = list(dict.fromkeys(grid))
    return [base] + [b for b in unique if b != base]


def chunk_for(T: int, blocks: BlockSizes) -> int:
    """blocks.chunk, or for a shorter sequence the smallest power of two >= max(T, 16)."""
    return blocks.chunk if T >= blocks.chunk else max(16, 1 << (T - 1).bit_length())


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
    """'gpu' or 'tpu': the given one, or the default device's ('gpu' on CPU, where kernels run interpreted). The
    caller (the op) passes the backend it targets."""
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


def matmul_for(dtype) -> Matmul:
    """The chunked kernels' matmuls for inputs of `dtype`: bf16 and fp16 inputs multiply in their own dtype on the
    tensor cores (float32 accumulation), so a bf16 run computes at bf16 rate, not TF32 at best; anything else in
    float32 with HIGHEST precision (exact)."""
    dtype = jnp.dtype(dtype)
    if dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return Matmul(dtype, jax.lax.Precision.DEFAULT)
    return Matmul(F32, jax.lax.Precision.HIGHEST)


def compiler_params(backend: str, blocks: BlockSizes, semantics: tuple[str, ...], *, decode: bool = False):
    """Mosaic parameters (grid axes' `semantics`) on TPU; Triton's warps and stages from `blocks` on GPU (the
    decode kernel's own with `decode`)."""
    if backend == "tpu":
        return pltpu.CompilerParams(dimension_semantics=semantics)
    if decode:
        return pltriton.CompilerParams(num_warps=blocks.decode_num_warps, num_stages=blocks.decode_num_stages)
    return pltriton.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages)
