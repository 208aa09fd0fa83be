"""A 2-layer PA model's (short convolution and QK-norm on) forward and backward with the kernels
(retention_impl="pallas", bf16), lowered from this CPU machine with `jax.export` under an abstract 8-device mesh: TPU
(Mosaic) and H200 (Triton), data (8,1,1) and fsdp (1,8,1), head dims 64 and 128. `lowering_for` targets the kernels
at the platform (no interpret mode; the attention layer takes splash on TPU through impl="auto", blockwise on the
H200: cuDNN's lowering asks for a GPU); the ops run them inside a shard_map over the batch (before this, lowering
failed: Mosaic kernels cannot be automatically partitioned)."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import AbstractDevice, AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from retention.nn import LM, LMConfig
from retention.ops.platform import lowering_for
from retention.parallel.sharding import state_shardings

DEVICES = {"tpu": ("TPU v5 lite", "tpu", "tpu_custom_call"), "cuda": ("NVIDIA H200", "cuda", "__gpu$xla.gpu.triton")}
TRITON = jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")


def _exported(platform: str, shape: tuple[int, int, int], d: int):
    kind, device_platform, _ = DEVICES[platform]
    device = AbstractDevice(device_kind=kind, num_cores=None, platform=device_platform)
    mesh = AbstractMesh(shape, ("data", "fsdp", "sequence"), axis_types=(AxisType.Auto,) * 3, abstract_device=device)
    config = LMConfig(
        vocab_size=64,
        d_model=2 * d,
        n_layers=2,
        pattern="PA",
        n_heads=2,
        n_kv_heads=2,
        head_dim=d,
        chunk_size=128,
        conv_size=4,  # the presets' parts: the short convolution and QK-norm lower with the kernels
        qk_norm=True,
        retention_impl="pallas",
        attention_impl="auto" if platform == "tpu" else "xla",  # cuDNN does not lower without a GPU ("not detected")
        dtype="bfloat16",
    )
    graphdef, params = nnx.split(nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0))))
    placed = lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    params = jax.tree.map(placed, params, state_shardings(params, mesh))
    tokens = jax.ShapeDtypeStruct((8, 256), jnp.int32, sharding=NamedSharding(mesh, P(("data", "fsdp"))))
    loss = lambda params, tokens: nnx.merge(graphdef, params)(tokens).astype(jnp.float32).mean()
    step = jax.jit(jax.value_and_grad(loss))
    target = lowering_for("tpu" if platform == "tpu" else "gpu")
    with jax.enable_x64(False), jax.sharding.use_abstract_mesh(mesh), target:  # x64: see attention/splash.py
        return jax.export.export(step, platforms=[platform], disabled_checks=[TRITON])(params, tokens)


SLOW = pytest.mark.slow  # the quick tier: one mesh and head dim per platform
CASES = [
    pytest.param("tpu", (8, 1, 1), 64, marks=SLOW),
    ("tpu", (1, 8, 1), 64),
    pytest.param("tpu", (8, 1, 1), 128, marks=SLOW),
]
CASES += [
    pytest.param("tpu", (1, 8, 1), 128, marks=SLOW),
    pytest.param("cuda", (8, 1, 1), 64, marks=SLOW),
    ("cuda", (1, 8, 1), 128),
]


@pytest.mark.parametrize("platform,shape,d", CASES)
def test_lm_with_kernels_lowers_under_mesh(platform, shape, d):
    exported = _exported(platform, shape, d)
    module = exported.mlir_module()
    assert exported.nr_devices == 8
    assert DEVICES[platform][2] in module  # the kernels themselves, not an interpreted copy
    assert "sdy.manual_computation" in module  # inside the shard_map


def test_lowering_for_names_its_backend():
    with pytest.raises(ValueError, match="backend"):
        with lowering_for("cuda"):
            pass


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_auto_takes_the_kernels_on_tpu_only(platform):
    """impl="auto" lowers power retention to the kernels for a TPU and to the XLA path for a GPU, where the Triton
    kernels did not compile on the first H200 run (experiments/PERF_LOG.md, 2026-12-04)."""
    from retention import power_retention

    x = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)
    op = lambda q, k, v: power_retention(q, k, v, impl="auto")
    with jax.enable_x64(False), lowering_for("tpu" if platform == "tpu" else "gpu"):
        module = jax.export.export(jax.jit(op), platforms=[platform], disabled_checks=[TRITON])(x, x, x).mlir_module()
    kernel_call = DEVICES[platform][2]
    assert (kernel_call in module) == (platform == "tpu")
