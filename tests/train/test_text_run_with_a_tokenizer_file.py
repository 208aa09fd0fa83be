"""A foreign tokenizer.json trains: a tiny text run with data.tokenizer=file (a Llama-2-style tokenizer built with
`tokenizers`, `</s>` as the end token) and data.sampler=epochs takes its steps, evaluates bits per byte and keeps
the tokenizer in its run folder."""

import json
import math

import numpy as np
import pytest

from retention.data.tokenizer import HFTokenizer
from retention.train import train
from tests.data.test_text_tokenizer_file import llama2_style
from tests.train.common import compose_config
from tests.train.test_text_eval import text_run


@pytest.mark.integration
def test_a_foreign_tokenizer_trains_a_step(tmp_path):
    run = tmp_path / "run"
    overrides = text_run(tmp_path, [])  # writes the documents under tmp_path/docs
    llama2_style([p.read_text() for p in sorted((tmp_path / "docs").iterdir())], tmp_path / "foreign.json")
    extra = [
        "data.tokenizer=file",
        f"data.tokenizer_file={tmp_path / 'foreign.json'}",
        'data.eod_token="</s>"',
        "data.sampler=epochs",
        "trainer.steps=1",
        "optim.warmup_steps=0",
        "trainer.eval_scales=[1]",
    ]
    summary = train(compose_config([*overrides, *extra]), str(run))
    assert summary["steps"] == 1 and math.isfinite(summary["train_loss"])
    values = summary["eval"]["16"]
    assert np.isfinite(values["bits_per_byte"]) and values["bits_per_byte"] < values["loss"] / math.log(2)
    kept = HFTokenizer.load(str(run / "tokenizer.json"), "</s>")
    record = json.load(open(run / "run.json"))
    assert record["data_fingerprints"]["tokenizer"] == kept.identity and kept.identity.endswith(f"-eod{kept.eod}")
    assert record["config"]["data"]["sampler"] == "epochs"
