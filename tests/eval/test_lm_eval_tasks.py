"""The adapter inside lm-eval: `simple_evaluate` with the model named `retention` and a run folder (its load_run
standing in for a trained run) on local task YAMLs over local jsonl files, offline, gives the accuracy and the
perplexities computed by hand from the adapter's own log-likelihoods; the run's tokenizer comes from its folder."""

import json
import math
import re

import numpy as np
import pytest
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager

import retention.eval.lm_eval_adapter as adapter_module
from retention.data.tokenizer import ByteTokenizer, HFTokenizer
from retention.eval.lm_eval_adapter import RetentionLM, text_tokenizer
from retention.train.config import DATA_SCHEMAS, Config
from tests.eval.common import BATCH, MAX_LENGTH

pytestmark = pytest.mark.integration  # run through lm-eval: make test-integration

SEED = int(np.random.SeedSequence().generate_state(1)[0])
TEXT_RUN = Config(data=DATA_SCHEMAS["text"](seq_len=MAX_LENGTH))  # bytes
MC_TASK = """task: tiny_mc
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}, cache_dir: {cache}}}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: label
doc_to_choice: choices
metric_list: [{{metric: acc}}]
"""
PPL_TASK = """task: tiny_ppl
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}, cache_dir: {cache}}}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list: [{{metric: word_perplexity}}, {{metric: byte_perplexity}}, {{metric: bits_per_byte}}]
"""


def sentence(rng, n_words: int) -> str:
    return " ".join("".join(rng.choice(list("abcdefghij"), rng.integers(1, 6))) for _ in range(n_words))


@pytest.fixture
def run_folder(tmp_path, monkeypatch, tiny_model):
    """A folder that load_run reads as a bytes text run of seq_len MAX_LENGTH holding the tiny model; the calls."""
    calls = []
    folder = tmp_path / "run"
    folder.mkdir()

    def load_run(path, step):
        calls.append((path, step))
        return tiny_model, TEXT_RUN, None

    monkeypatch.setattr(adapter_module, "load_run", load_run)
    return folder, calls


def test_simple_evaluate_on_local_tasks(tmp_path, monkeypatch, run_folder, adapter):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rng = np.random.default_rng(SEED)
    mc = [
        {"question": sentence(rng, 3), "choices": [sentence(rng, k) for k in (1, 2, 1)], "label": int(rng.integers(3))}
        for _ in range(8)
    ]
    ppl = [{"text": sentence(rng, n)} for n in (3, 9, 20)]  # the last longer than one window
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, docs, template in (("mc", mc, MC_TASK), ("ppl", ppl, PPL_TASK)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        data, cache = json.dumps(str(tmp_path / f"{name}.jsonl")), json.dumps(str(tmp_path / "hf_cache"))
        (tasks / f"{name}.yaml").write_text(template.format(data=data, cache=cache))

    results = simple_evaluate(
        model="retention",
        model_args={"path": str(run_folder[0])},
        tasks=["tiny_mc", "tiny_ppl"],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        batch_size=BATCH,
        device="cuda:0",  # what lm-eval's command line passes by default: accepted, JAX places the model
        torch_random_seed=None,
    )
    assert run_folder[1] == [(str(run_folder[0]), None)]

    def loglikelihoods(args):
        return [logp for logp, _ in adapter.loglikelihood([Instance("loglikelihood", {}, a, 0) for a in args])]

    correct = [
        int(np.argmax(loglikelihoods([(f"Question: {d['question']}\nAnswer:", f" {c}") for c in d["choices"]])))
        == d["label"]
        for d in mc
    ]
    assert results["results"]["tiny_mc"]["acc,none"] == pytest.approx(np.mean(correct), abs=1e-12), SEED
    texts = [d["text"] for d in ppl]
    total = sum(adapter.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), 0) for t in texts]))
    assert len(texts[-1]) > MAX_LENGTH
    n_bytes, n_words = sum(len(t.encode()) for t in texts), sum(len(re.split(r"\s+", t)) for t in texts)
    got = results["results"]["tiny_ppl"]
    assert got["bits_per_byte,none"] == pytest.approx(-total / n_bytes / math.log(2), rel=1e-9), SEED
    assert got["byte_perplexity,none"] == pytest.approx(math.exp(-total / n_bytes), rel=1e-9), SEED
    assert got["word_perplexity,none"] == pytest.approx(math.exp(-total / n_words), rel=1e-9), SEED


def test_model_args_from_the_command_line(run_folder):
    """lm-eval's `--model retention --model_args path=...,step=...` string: the registry's class, load_run called
    with the folder and step, the run's tokenizer and seq_len; an unknown key named."""
    folder, calls = run_folder
    lm = get_model("retention").create_from_arg_string(f"path={folder},step=7,batch_size=auto", {"max_batch_size": 3})
    assert isinstance(lm, RetentionLM) and calls == [(str(folder), 7)]
    assert isinstance(lm.tokenizer, ByteTokenizer) and lm.max_length == MAX_LENGTH and lm.batch_size == 3
    assert lm.max_gen_toks == MAX_LENGTH // 2
    assert get_model("dummy").__name__ == "DummyLM"  # lm-eval's own models stay known beside it
    with pytest.raises(ValueError, match=r"unknown \['pretrained'\]"):
        get_model("retention").create_from_arg_string(f"pretrained={folder}")


def test_text_tokenizer_is_the_runs_or_bytes(tmp_path):
    """load_run's tokenizer (a bpe run's) passes through, a bytes run's None becomes the byte tokenizer, and a run
    of another task is refused naming it."""
    assert isinstance(text_tokenizer(str(tmp_path), TEXT_RUN, None), ByteTokenizer)
    rng = np.random.default_rng(SEED)
    trained = HFTokenizer.train((sentence(rng, 30) for _ in range(20)), 300, "<|eod|>")
    bpe_run = Config(data=DATA_SCHEMAS["text"](tokenizer="bpe", vocab_size=300, eod_token="<|eod|>"))
    assert text_tokenizer(str(tmp_path), bpe_run, trained) is trained
    with pytest.raises(ValueError, match="data.task=mqar"):
        text_tokenizer(str(tmp_path), Config(data=DATA_SCHEMAS["mqar"]()), None)
