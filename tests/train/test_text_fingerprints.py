"""A text run's record keeps its tokenizer's and its corpus's content hashes: a resume with another
tokenizer.json or with rewritten training files is refused naming what changed, before any work; a damaged
tokenizer.json is named; the same data resumes."""

import json
import shutil

import pytest

from retention.train import train
from retention.train.record import RunMismatch
from tests.train.common import compose_config
from tests.train.test_text_eval import text_run


@pytest.mark.integration
def test_a_resume_with_another_tokenizer_or_corpus_is_refused(tmp_path):
    run = tmp_path / "run"
    extra = ["data.tokenizer=bpe", "data.vocab_size=300", "trainer.ckpt_every=2", "trainer.eval_scales=[1]"]
    overrides = text_run(tmp_path, extra)
    train(compose_config([*overrides, "trainer.steps=2"]), str(run))
    tokenizer, doc = run / "tokenizer.json", tmp_path / "docs" / "0.py"
    shutil.copy(tokenizer, tmp_path / "kept.json")
    resume = compose_config([*overrides, "trainer.steps=3"])

    saved = json.loads(tokenizer.read_text())
    vocab = saved["model"]["vocab"]
    a, b = sorted(t for t, i in vocab.items() if 100 <= i < 200)[:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # the same size and shapes, another tokenizer
    tokenizer.write_text(json.dumps(saved))
    with pytest.raises(RunMismatch, match=r"the tokenizer \(the run folder's tokenizer.json\): fingerprint bpe-"):
        train(resume, str(run))

    shutil.copy(tmp_path / "kept.json", tokenizer)
    text = doc.read_text()
    doc.write_text(text[::-1])  # the same size, other content
    with pytest.raises(RunMismatch, match=r"the corpus \(the content of the training files\): fingerprint") as info:
        train(resume, str(run))
    assert "tokenizer" not in str(info.value).split("holds another run")[1].split("Only")[0]

    doc.write_text(text)
    tokenizer.write_bytes((tmp_path / "kept.json").read_bytes()[:500])
    with pytest.raises(ValueError, match=rf"tokenizer.json at {tokenizer} cannot be read .*cut short"):
        train(resume, str(run))

    shutil.copy(tmp_path / "kept.json", tokenizer)
    assert train(resume, str(run))["resumed_from"] == 2  # the run's own data resumes
