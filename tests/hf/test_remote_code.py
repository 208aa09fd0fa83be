"""Exports in the retention layout load in transformers through their own PyTorch code (retention/hf/remote/,
named by config.json's auto_map): for each layer letter (P at degrees 2 and 4, with and without its gate; A and W
with the short convolution; D, G, M) and hybrids (scanned, untied, without MLPs), a tiny run trained two steps and
exported gives, from `AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)`, load_run's logits on
random tokens of an odd length to float32 accuracy, and transformers' greedy `generate` with its cache gives
`retention.generate`'s tokens."""

import json
import pathlib
import stat

import numpy as np
import pytest

from retention import generate, load_run
from retention.export import export_run
from retention.train import train
from tests.hf.common import torch, transformers
from tests.train.common import TINY, compose_config

pytestmark = pytest.mark.integration  # checked against transformers: make test-integration

jnp = pytest.importorskip("jax.numpy")
NEW = 8  # tokens generated
REMOTE = pathlib.Path(__file__).resolve().parents[2] / "retention" / "hf" / "remote"
CASES = {  # the model overrides of each run, beside TINY's (2 layers of d_model 16, 2 heads of 8, conv 4, QK-norm)
    "P": ["model.pattern=P", "model.deg=2", "model.gating=true"],
    "P_deg4_ungated": ["model.pattern=P", "model.deg=4", "model.gating=false", "model.n_kv_heads=1"],
    "A": ["model.pattern=A", "model.n_kv_heads=1"],  # GQA; the convolution keeps it out of the Llama layout
    "W": ["model.pattern=W", "model.window=4"],  # a window shorter than the tokens
    "D": ["model.pattern=D", "model.n_kv_heads=1"],
    "G": ["model.pattern=G"],
    "M": ["model.pattern=M", "model.ssm_state_size=8", "model.mlp_width=0"],  # Mamba2's blocks: no MLP
    "PA_rope_untied": [
        "model.pattern=PA",
        "model.tie_embeddings=false",
        "+model.layers.P.rope_base=500.0",  # P with RoPE too
        "model.rope_scaling=llama3",
        "model.rope_factor=4.0",
        "model.rope_original_max_len=8",
    ],
    "PAWD_scanned": ["model.pattern=PAWD", "model.n_layers=4", "model.scan_layers=true", "model.window=4"],
}


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory):
    """(the case, the export folder) of a tiny run of CASES[case] trained two steps (one per module)."""
    folder = tmp_path_factory.mktemp(request.param)
    run, out = folder / "run", folder / "out"
    overrides = [*TINY, "trainer.steps=2", "optim.lr=0.05", "trainer.eval_scales=[1]", *CASES[request.param]]
    train(compose_config(overrides), str(run))
    export_run(str(run), str(out))
    return request.param, out


def test_transformers_runs_every_layer_of_an_export(exported):
    case, out = exported
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "retention" and "AutoModelForCausalLM" in config["auto_map"]
    for file in ("modeling_retention.py", "configuration_retention.py"):  # the package's files, readable by others
        assert (out / file).read_bytes() == (REMOTE / file).read_bytes()
        assert stat.S_IMODE((out / file).stat().st_mode) == 0o644
    model, _, _ = load_run(str(out))  # the export still reads back, auto_map and all
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True).float().eval()

    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 13))  # odd, past the window
    want = np.asarray(model(jnp.asarray(tokens, jnp.int32)))
    with torch.no_grad():
        got = reloaded(torch.as_tensor(tokens)).logits.numpy()
    diff, scale = np.abs(got - want).max(), np.abs(want).max()
    print(f"{case}: max |logit difference| {diff:.2e} of logits up to {scale:.2f}")
    assert diff <= 1e-4 * scale, (case, diff, scale)

    prompt = tokens[:, :7]
    with torch.no_grad():
        ids = torch.as_tensor(prompt)
        out_ids = reloaded.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False, use_cache=True
        )
    greedy = generate(model, jnp.asarray(prompt, jnp.int32), NEW, temperature=0.0)
    np.testing.assert_array_equal(out_ids.numpy()[:, -NEW:], np.asarray(greedy.tokens)[:, -NEW:])


def test_the_cache_continues_a_forward(exported):
    """A prompt then one token at a time through the returned cache gives the full forward's logits, and a
    left-padded row (attention_mask 0) gives the row alone's."""
    _, out = exported
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True).float().eval()
    tokens = torch.as_tensor(np.random.default_rng(1).integers(0, reloaded.config.vocab_size, (2, 9)))
    with torch.no_grad():
        full = reloaded(tokens).logits
        step = reloaded(tokens[:, :5], use_cache=True)
        logits = [step.logits]
        for t in range(5, 9):
            cache = step.cache if hasattr(step, "cache") else step.past_key_values  # transformers 5's name, or 4's
            step = reloaded(tokens[:, t : t + 1], use_cache=True, cache=cache)
            logits.append(step.logits)
        scale = full.abs().max().item()
        np.testing.assert_allclose(torch.cat(logits, 1).numpy(), full.numpy(), rtol=1e-5, atol=1e-5 * scale)
        padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), tokens[:1, :6]], 1)
        mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)], 1)
        alone = reloaded(tokens[:1, :6]).logits.numpy()
        got = reloaded(padded, attention_mask=mask).logits[:, 3:].numpy()
        np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-5 * np.abs(alone).max())
