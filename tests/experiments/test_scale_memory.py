"""The scale preset (experiment=scale_125m, model=hybrid_125m) is the size it says, counted from shapes; its
compiled step's memory under 8-device meshes is checked in tests/parallel/multidevice_scale_memory.py."""

import argparse

import pytest
from flax import nnx

from experiments.compare.models import compose_config
from experiments.scale_memory import EXPERIMENT, parse_mesh
from retention.nn import LM
from retention.nn.sizing import count_params
from retention.train.config import make_lm_config

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration


def test_scale_preset_has_about_125m_parameters_at_16k():
    cfg = compose_config([EXPERIMENT])
    lm = make_lm_config(cfg.model, cfg.data.vocab_size)
    counted = nnx.eval_shape(lambda: LM(lm, rngs=nnx.Rngs(0))).param_count()  # from the parameters' shapes
    assert counted == count_params(lm)
    assert abs(counted - 125e6) < 0.1 * 125e6, counted
    assert (lm.d_model, lm.n_layers, lm.layer_kinds, lm.dtype) == (768, 12, "PPPA" * 3, "bfloat16")
    assert (cfg.data.seq_len, cfg.data.batch_size, cfg.mesh.data, cfg.mesh.fsdp) == (16384, 32, 1, -1)


@pytest.mark.parametrize("text", ["3x3", "8", "0x8", "2x4x1", "ax8"])
def test_parse_mesh_refuses_what_is_not_8_devices_as_data_x_fsdp(text):
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
        parse_mesh(text)
    assert parse_mesh("2x4") == (2, 4)
