"""Whether a Mosaic GPU kernel shaped like the state pass's core lowers for an H200 from this machine (no GPU needed).

The kernel: S = sum over chunks of k_n^T v_n, [d, e] float32 in a WGMMA accumulator, with k (transposed) and v
streamed chunk by chunk from HBM into swizzled shared memory by `plgpu.emit_pipeline`, bf16 `plgpu.wgmma` per chunk.
It is the state pass without the gates, masks and expanded-feature rows (see the report in issue 15). Prints the
custom calls of the exported module, or the error.

    python -m experiments.mosaic_gpu_probe
"""

import re

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.sharding import AbstractDevice, AbstractMesh

H200 = AbstractMesh(
    (1,), ("x",), abstract_device=AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="cuda")
)
CHUNK, D, N = 64, 64, 4


def state_sum(kt_gmem, v_gmem, s_gmem):
    """s = sum_n kt[:, chunk n] @ v[chunk n, :]: kt [D, N * CHUNK], v [N * CHUNK, D] bf16 in HBM, s [D, D] float32."""

    def scoped(acc_ref):
        def step(_, kt_smem, v_smem):
            plgpu.wgmma(acc_ref, kt_smem, v_smem)
            plgpu.wgmma_wait(0)

        layout = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
        specs = [
            plgpu.BlockSpec((D, CHUNK), lambda i: (0, i), transforms=layout),
            plgpu.BlockSpec((CHUNK, D), lambda i: (i, 0), transforms=layout),
        ]
        plgpu.emit_pipeline(step, grid=(N,), in_specs=specs)(kt_gmem, v_gmem)
        s_gmem[...] = acc_ref[...]

    pl.run_scoped(scoped, plgpu.ACC((D, D), jnp.float32))


def main():
    kernel = plgpu.kernel(state_sum, out_type=jax.ShapeDtypeStruct((D, D), jnp.float32))
    kt = jax.ShapeDtypeStruct((D, N * CHUNK), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((N * CHUNK, D), jnp.bfloat16)
    checks = [jax.export.DisabledSafetyCheck.custom_call("mosaic_gpu_v2")]
    try:
        with jax.sharding.use_abstract_mesh(H200):
            module = jax.export.export(jax.jit(kernel), platforms=["cuda"], disabled_checks=checks)(kt, v).mlir_module()
    except Exception as error:  # the finding is the error itself
        print(f"does not lower: {type(error).__name__}: {error}")
        return
    print("lowers; custom calls:", sorted(set(re.findall(r"custom_call @([\w$.]+)", module))))


if __name__ == "__main__":
    main()
