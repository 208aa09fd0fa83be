"""The logical-axis rules in-process (one device): the rules' checks naming the entry and what is allowed, the fit
of a spec to a shape and a mesh, the config's default rules, and every parameter of a model with every mixer named
with known logical axes, one per dimension. Their placement on 8 devices: multidevice_logical_axes.py."""

import dataclasses
import os

import jax
import pytest
import yaml
from flax import nnx
from jax.sharding import PartitionSpec as P

from retention.configs import CONFIG_DIR
from retention.nn import LM, LMConfig
from retention.parallel import DEFAULT_RULES, LOGICAL_AXES, check_rules
from retention.parallel.rules import fit_spec


@pytest.mark.parametrize(
    "rules,message",
    [
        ("embed", r"mesh.rules must be a list of \[logical name, mesh axis or axes or null\] pairs, got 'embed'"),
        ([["embed"]], r"mesh.rules\[0\] must be a \[logical name, mesh axis or axes or null\] pair, got \['embed'\]"),
        ([["embed", "fsdp"], ["hedas", "tensor"]], r"mesh.rules\[1\]: unknown logical axis 'hedas'; allowed: \["),
        ([["heads", "tensr"]], r"mesh.rules\[0\] \('heads'\): unknown mesh axis 'tensr'; allowed: \['data', 'fsdp'"),
        ([["mlp", ["tensor", "model"]]], r"unknown mesh axis 'model'"),
        ([["mlp", "tensor"], ["mlp", None]], r"mesh.rules gives 'mlp' twice \(mesh.rules\[0\] and \[1\]\)"),
        ([["batch", ["data", "data"]]], r"mesh.rules\[0\] \('batch'\) repeats a mesh axis: \['data', 'data'\]"),
    ],
)
def test_bad_rules_name_the_entry(rules, message):
    with pytest.raises(ValueError, match=message):
        check_rules(rules)


def test_rules_normalised():
    rules = check_rules([["batch", ["data", "fsdp"]], ["embed", ["fsdp"]], ["heads", None], ["mlp", "tensor"]])
    assert rules == (("batch", ("data", "fsdp")), ("embed", "fsdp"), ("heads", None), ("mlp", "tensor"))


def test_config_rules_are_the_default_rules():
    with open(os.path.join(CONFIG_DIR, "mesh", "auto.yaml")) as f:
        assert check_rules(yaml.safe_load(f)["rules"]) == DEFAULT_RULES


MESH = {"data": 2, "fsdp": 4, "sequence": 1, "tensor": 2}


@pytest.mark.parametrize(
    "spec,shape,want",
    [
        (("fsdp", "tensor"), (12, 6), P("fsdp", "tensor")),
        (("fsdp", "tensor"), (6, 6), P(None, "tensor")),  # 4 does not divide 6: replicated on that dimension
        (("tensor", "fsdp"), (5, 8), P(None, "fsdp")),
        ((("data", "fsdp"), "sequence"), (8, 5), P(("data", "fsdp"))),  # sequence of size 1 splits nothing
        ((("data", "fsdp"), None), (6, 5), P("data")),  # 2 divides 6, 2 * 4 does not
        ((("data", "fsdp"), "fsdp", "tensor"), (8, 8, 4), P(("data", "fsdp"), None, "tensor")),  # fsdp used once
        (("heads", "fsdp"), (4, 4), P(None, "fsdp")),  # a logical name without a rule: replicated
        ((None,), (7, 3), P()),
        ((), (), P()),
    ],
)
def test_fit_spec(spec, shape, want):
    assert fit_spec(spec, shape, MESH) == want


def test_every_parameter_has_logical_axes():
    """Every mixer kind with its optional parts, untied head, unscanned and scanned: each parameter's
    out_sharding names one known logical axis per dimension (the scanned stack's leading one "layers")."""
    config = LMConfig(
        vocab_size=40, d_model=16, n_layers=6, pattern="PAWDGM", n_heads=2, n_kv_heads=1, head_dim=8,
        conv_size=3, qk_norm=True, tie_embeddings=False, ssm_state_size=4, window=4,
    )  # fmt: skip
    for scan in (False, True):
        form = dataclasses.replace(config, scan_layers=scan)
        model = nnx.eval_shape(lambda c=form: LM(c, rngs=nnx.Rngs(0)))
        leaves = jax.tree_util.tree_flatten_with_path(
            nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable)
        )[0]
        assert len(leaves) > 60
        for path, variable in leaves:
            names = variable.get_metadata().get("out_sharding")
            where = jax.tree_util.keystr(path)
            assert names is not None and len(names) == variable.ndim, (where, names, variable.shape)
            assert set(names) <= set(LOGICAL_AXES), (where, names)
            assert (names[0] == "layers") == (scan and "periods" in where), (where, names)
