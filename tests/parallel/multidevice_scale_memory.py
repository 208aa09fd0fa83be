"""The scale preset on 8 host devices (run by test_eight_devices.py): under 1x8 and 2x4 meshes of data x fsdp its
train state is sharded by the logical-axis rules (`embed` over fsdp: one device holds its fsdp share), and its
compiled 16k-token train step fits an H200 by XLA's memory analysis (compiled for the CPU from shapes alone: an
estimate of the GPU's)."""

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.compare.models import compose_config
from experiments.scale_memory import BAR_BYTES, EXPERIMENT, per_device_bytes, scale_memory
from retention.nn import LM
from retention.parallel import make_mesh, state_shardings
from retention.train.config import make_lm_config
from retention.train.optimizer import make_optimizer
from retention.train.step import make_init
from tests.parallel.common import require_devices

require_devices()
pytestmark = pytest.mark.integration  # run by test_eight_devices.py's integration test, in its tier

MESHES = [(1, 8), (2, 4)]


@pytest.mark.parametrize("data,fsdp", MESHES)
def test_scale_preset_state_is_split_over_the_fsdp_axis(data, fsdp):
    cfg = compose_config([EXPERIMENT])
    lm = make_lm_config(cfg.model, cfg.data.vocab_size)
    tx, _ = make_optimizer(cfg.optim, cfg.trainer.steps)
    state = jax.eval_shape(make_init(lm, tx, cfg.seed))
    shardings = state_shardings(state, make_mesh(data, fsdp, 1))
    leaves = list(zip(jax.tree.leaves(state), jax.tree.leaves(shardings)))
    nbytes = lambda x: int(np.prod(x.shape)) * x.dtype.itemsize
    replicated = sum(nbytes(x) for x, s in leaves if "fsdp" not in s.spec)
    total = sum(nbytes(x) for x, _ in leaves)
    assert replicated < 1e-3 * total  # only the small leaves (scalars, per-head gate biases) stay whole
    assert per_device_bytes(state, shardings) == (total - replicated) // fsdp + replicated
    model = nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(0)))
    assert total > 3 * 4 * model.param_count() * 0.99  # float32 parameters and two AdamW moments


@pytest.mark.slow  # two 16k-token steps of a 125M model compiled for 8 CPU devices
def test_scale_preset_train_step_fits_an_h200_under_both_meshes():
    result = scale_memory(MESHES)
    for name, m in result["meshes"].items():
        assert m["temp_bytes"] > 2**30, name  # a real estimate of a large step
        assert m["total_bytes"] < BAR_BYTES and m["fits"], (name, m["total_bytes"] / 2**30)
