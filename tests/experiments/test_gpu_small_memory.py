"""gpu_small's compiled train steps fit one H200. A program cannot be compiled for a GPU without one (an abstract
H200 mesh lowers, but compiling needs a device), so this compiles the steps at gpu_small's largest shapes (the
4-layer ~30M bf16 models, its tokens per step at T = 64k) for the CPU, from shapes alone, and checks XLA's memory
analysis against the memory JAX takes on an H200 by default (75% of its 139 GiB). It is an estimate: the GPU's
compiler assigns buffers its own way and the Pallas kernels replace the XLA chunked path there.
"""

import pytest

from experiments.compare.models import compose_config, entry_overrides
from experiments.compare.presets import GPU_SMALL
from experiments.compare.speed import abstract_train_step
from experiments.scale_memory import BAR_BYTES, step_bytes

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration


@pytest.mark.slow  # a 64k-token step of a 30M model compiled for the CPU
@pytest.mark.parametrize("model", ["softmax", "power"])
def test_gpu_small_train_steps_fit_an_h200(model):
    cfg = compose_config(entry_overrides(model, GPU_SMALL))
    T = max(GPU_SMALL.speed.lengths)
    *_, compiled = abstract_train_step(cfg, T, GPU_SMALL.speed.tokens_per_step // T)
    memory = compiled.memory_analysis()
    assert memory.temp_size_in_bytes > 2**30  # a real estimate of a large step
    assert step_bytes(memory) < BAR_BYTES, f"{step_bytes(memory) / 2**30:.1f} GiB"
