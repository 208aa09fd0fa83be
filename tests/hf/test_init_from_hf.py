"""`init_from=hf:DIR`: the trainer's source loader reads a Hugging Face folder through load_hf."""

import jax
import numpy as np
import pytest
from flax import nnx

from retention.hf import load_hf
from retention.train.init_from import check_source, load_source
from tests.hf.common import save_tiny

pytestmark = pytest.mark.integration  # its checkpoint is built by transformers on torch: make test-integration


def test_init_from_reads_a_hugging_face_folder(tmp_path):
    save_tiny(tmp_path, "Qwen2ForCausalLM")
    assert check_source(f"hf:{tmp_path}") == ("hf", str(tmp_path))
    model = load_source(f"hf:{tmp_path}")
    direct, _ = load_hf(str(tmp_path))
    assert model.config == direct.config and model.config.qkv_bias
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(direct)), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="init_from must be <source>:<folder>"):
        check_source(f"hugging:{tmp_path}")
