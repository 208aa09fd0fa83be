"""`python -m experiments.long_context` end to end on tiny models trained a few steps: the loss by position on the
long-document eval split (the documents recorded by name and sha256, as the files are; RoPE rows past the training
length; the carry path's buckets equal to the forward's) and recall (MQAR with a gap of half the length, passkey at
every depth, at least the queries asked for); RoPE rows and the query count on their own; bad flags refused before
any run is read."""

import hashlib
import json
import math
import os

import jax
import pytest
from flax import nnx

from experiments.hydra_run import train_once
from experiments.long_context import report
from experiments.long_context.__main__ import main, merged
from experiments.long_context.models import AS_TRAINED, Trained, rope_variants
from experiments.long_context.recall import rows_and_batch
from retention.nn import LM, LMConfig
from retention.train.config import register_configs
from tests.train.common import TINY_MODEL, compose_config

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration

TINY = [
    *TINY_MODEL,
    "data.seq_len=64",
    "data.batch_size=2",
    "optim.warmup_steps=1",
    "trainer.steps=2",
    "trainer.eval_batches=1",
    "trainer.eval_scales=[1]",
    "trainer.progress=false",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny runs trained 2 steps: {name: folder} of softmax and a PA hybrid on data=long_text, softmax on MQAR,
    power retention on passkey."""
    register_configs()
    root = tmp_path_factory.mktemp("long_context")
    jobs = {
        "text_softmax": ["data=long_text", "model=softmax"],
        "text_hybrid": ["data=long_text", "model=hybrid", "model.pattern=PA"],
        "mqar_softmax": ["data=mqar", "model=softmax", "data.num_kv_pairs=4"],
        "passkey_power": ["data=passkey", "model=power"],
    }
    for name, overrides in jobs.items():
        train_once(str(root / name), [*overrides, *TINY])
    return {name: str(root / name) for name in jobs}


@pytest.mark.xdist_group("long_context_runs")  # one worker trains the `runs` fixture, once
def test_text_reads_the_recorded_documents_by_position(runs, tmp_path):
    out = tmp_path / "text.json"
    main(["text", runs["text_softmax"], runs["text_hybrid"], "--length", "512", "--docs", "2", "--out", str(out)])
    result = json.loads(out.read_text())
    docs = result["documents"]
    assert docs["count"] == 2 == len(docs["chosen"]) and docs["rule"]["min_doc_bytes"] == 65536
    assert docs["rule"]["min_ids"] == 513 and docs["rule"]["eval_fraction"] == 0.2
    for d in docs["chosen"]:
        raw = open(os.path.join(docs["rule"]["source"], d["name"]), "rb").read()
        assert hashlib.sha256(raw).hexdigest() == d["sha256"] and len(raw) == d["bytes"] >= 65536
    rows = {(r["name"], r["rope"]): r for r in result["models"]}
    assert set(rows) == {(n, r) for n in ("softmax", "hybrid") for r in (AS_TRAINED, "llama3")}
    assert rows["softmax", "llama3"]["rope_factor"] == 8.0 and rows["softmax", AS_TRAINED]["rope_factor"] is None
    for row in result["models"]:
        assert [(b["lo"], b["hi"]) for b in row["buckets"]][-2:] == [(128, 256), (256, 512)]
        assert all(b["tokens"] == 2 * (b["hi"] - b["lo"]) for b in row["buckets"]) and row["tokens"] == 1024
        assert row["path"] == "forward" and row["forward_bytes"] > 0 and row["cache_bytes"] > 0
        assert row["trained_length"] == 64 and math.isfinite(row["bits_per_byte"])
    page = out.with_suffix(".md").read_text()
    assert "| softmax (AA, RoPE), RoPE llama3 | 64 |" in page and docs["chosen"][0]["sha256"] in page
    assert out.with_suffix(".png").stat().st_size > 10_000
    carried = tmp_path / "carry.json"
    args = ["text", runs["text_softmax"], "--length", "512", "--docs", "2", "--rope", "--path", "carry"]
    main([*args, "--segment", "96", "--out", str(carried)])
    (row,) = json.loads(carried.read_text())["models"]
    assert row["path"] == "carry" and row["segment"] == 96
    for got, want in zip(row["buckets"], rows["softmax", AS_TRAINED]["buckets"]):
        assert got["nll"] == pytest.approx(want["nll"], rel=2e-5), got


@pytest.mark.xdist_group("long_context_runs")  # one worker trains the `runs` fixture, once
def test_merge_adds_models_as_one_read_would(runs, tmp_path):
    """--merge: softmax read first, the hybrid added by a second call, gives the rows of one call reading both
    (both commands recorded); a call with another length is refused and leaves the JSON as it was."""
    flags = ["--length", "256", "--docs", "1", "--rope"]
    together, merged = tmp_path / "together.json", tmp_path / "merged.json"
    main(["text", runs["text_softmax"], runs["text_hybrid"], *flags, "--out", str(together)])
    main(["text", runs["text_softmax"], *flags, "--out", str(merged)])
    main(["text", runs["text_hybrid"], *flags, "--merge", "--out", str(merged)])
    want, got = json.loads(together.read_text()), json.loads(merged.read_text())
    assert [r["label"] for r in got["models"]] == [r["label"] for r in want["models"]]
    for g, w in zip(got["models"], want["models"]):
        assert [b["nll"] for b in g["buckets"]] == pytest.approx([b["nll"] for b in w["buckets"]], rel=1e-6)
    assert len(got["command"]) == 2 and got["command"][1].endswith(f"--merge --out {merged}")
    assert got["command"][0] in merged.with_suffix(".md").read_text()
    before = merged.read_text()
    with pytest.raises(ValueError, match="--merge: length differs"):
        main(["text", runs["text_hybrid"], "--length", "128", "--docs", "1", "--rope", "--merge", "--out", str(merged)])
    assert merged.read_text() == before


def test_merge_keeps_the_seeds_of_one_model_apart():
    """Rows of one label from two run folders (a model's seeds) are both kept; the same folder read again with the
    same RoPE replaces its row, and another RoPE of it is a row of its own."""
    row = lambda run, rope, acc: {"run": run, "rope": rope, "label": "power (PP)", "acc": acc}
    setting = {"lengths": [4096], "queries": 512, "gap_fraction": 0.5, "batch_tokens": 65536}
    earlier = {
        **setting,
        "command": "first",
        "models": [row("seed0", "as trained", 0.9), row("seed1", "as trained", 0.1)],
    }
    later = {
        **setting,
        "command": "second",
        "models": [row("seed2", "as trained", 0.5), row("seed1", "as trained", 0.2)],
    }
    later["models"].append(row("seed1", "llama3", 0.3))
    got = merged(earlier, later, "recall")
    assert [(r["run"], r["rope"], r["acc"]) for r in got["models"]] == [
        ("seed0", "as trained", 0.9),
        ("seed2", "as trained", 0.5),
        ("seed1", "as trained", 0.2),
        ("seed1", "llama3", 0.3),
    ]
    assert got["command"] == ["first", "second"]


def test_text_figure_tells_training_lengths_apart(tmp_path, monkeypatch):
    """A model trained at 2k and at 16k: two lines of one colour told apart by marker and by the length in the
    label; a result of one training length keeps its labels as they are."""
    drawn = []
    monkeypatch.setattr(report, "save", lambda fig, path: drawn.append(fig) or path.name)
    buckets = [{"lo": hi // 16, "hi": hi, "bits_per_byte": 2.0} for hi in (16, 256, 4096)]
    row = lambda T: {
        "run": f"text/power/T{T}",
        "cache_bytes": 1,
        "seconds": 1.0,
        "tokens": 4096,
        "bits_per_byte": 2.0,
        "name": "power",
        "rope": AS_TRAINED,
        "label": "power (PP)",
        "trained_length": T,
        "buckets": buckets,
    }
    result = {"length": 4096, "documents": {"count": 1}, "models": [row(16384), row(2048)]}
    report.text_figure(result, tmp_path / "two.png")
    report.text_figure({**result, "models": [row(2048)]}, tmp_path / "one.png")
    two, one = (fig.axes[0].get_lines() for fig in drawn)
    two = [line for line in two if line.get_label()[0] != "_"]  # the training lengths' vertical lines are unlabelled
    assert [line.get_label() for line in two] == ["power (PP), trained at 16k", "power (PP), trained at 2k"]
    assert [line.get_marker() for line in two] == ["^", "o"] and two[0].get_color() == two[1].get_color()
    assert [line.get_label() for line in one if line.get_label()[0] != "_"] == ["power (PP)"]


@pytest.mark.xdist_group("long_context_runs")  # one worker trains the `runs` fixture, once
def test_recall_reads_at_least_the_queries_asked_for(runs, tmp_path):
    out = tmp_path / "recall.json"
    flags = ["--lengths", "128", "256", "--queries", "41", "--batch-tokens", "512", "--rope", "linear"]
    main(["recall", runs["mqar_softmax"], runs["passkey_power"], *flags, "--out", str(out)])
    result = json.loads(out.read_text())
    rows = {(r["task"], r["rope"]): r for r in result["models"]}
    assert set(rows) == {("mqar", AS_TRAINED), ("mqar", "linear"), ("passkey", AS_TRAINED)}  # power has no RoPE
    for (task, _), row in rows.items():
        assert set(row["lengths"]) == {"128", "256"}
        for L, m in row["lengths"].items():
            assert m["queries"] >= 41 and 0 <= m["accuracy"] <= 1 and 0 <= m["exact_match"] <= 1
            if task == "mqar":
                assert m["queries"] == 4 * m["sequences"] == 4 * 12 and m["min_gap"] == int(L) // 2
            else:
                per_depth = {"128": 9, "256": 10}[L]  # 9 passkeys a depth: 3 batches of 3 rows, 5 of 2
                assert set(m["depths"]) == {"0", "0.25", "0.5", "0.75", "1"} and m["queries"] == 5 * per_depth
                assert all(d["queries"] == per_depth for d in m["depths"].values())
    assert rows["mqar", "linear"]["lengths"]["256"]["rope_factor"] == 4.0
    page = out.with_suffix(".md").read_text()
    assert "## mqar (accuracy)" in page and "## passkey (exact match)" in page and "(48)" in page
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_rows_hold_at_least_the_queries_asked_for():
    for queries in (1, 7, 64, 511, 512, 513, 4096):
        for per_row in (1, 4, 64):
            for L, batch_tokens in ((4096, 65536), (65536, 65536), (16384, 1)):
                rows, batches, batch = rows_and_batch(queries, per_row, L, batch_tokens)
                most = max(1, batch_tokens // L)
                assert rows * per_row >= queries > (rows - 1) * per_row and rows <= batches * batch < rows + batches
                assert batch <= most and batches == -(-rows // most)  # the fewest batches that fit
    with pytest.raises(ValueError, match="queries must be an int >= 1, got 0"):
        rows_and_batch(0, 4, 64, 64)


def test_rope_rows_only_for_a_softmax_read_past_its_training_length():
    cfg = compose_config(["data=long_text", "model=hybrid", "model.pattern=PA", *TINY])
    lm = LMConfig(vocab_size=257, d_model=16, n_layers=2, pattern="PA", n_heads=2, n_kv_heads=2, head_dim=8)
    trained = Trained("run", LM(lm, rngs=nnx.Rngs(0)), cfg, None, 2)
    assert rope_variants(trained, 64, ("linear", "llama3")) == [trained]  # at the training length
    rows = rope_variants(trained, 1024, ("linear", "llama3"))
    assert [r.rope for r in rows] == [AS_TRAINED, "linear", "llama3"] and [r.rope_factor for r in rows[1:]] == [16, 16]
    for r in rows[1:]:
        c = r.model.config
        assert (c.rope_scaling, c.rope_factor, c.rope_original_max_len) == (r.rope, 16.0, 64)
        assert r.model.blocks[1].mixer.rope_scaling.kind == r.rope  # the A layer reads it
        same = zip(jax.tree.leaves(nnx.state(r.model)), jax.tree.leaves(nnx.state(trained.model)))
        assert all(a is b for a, b in same)  # the same weights, not copies
    power = LM(
        LMConfig(vocab_size=257, d_model=16, n_layers=2, pattern="P", n_heads=2, n_kv_heads=2, head_dim=8),
        rngs=nnx.Rngs(0),
    )
    assert len(rope_variants(Trained("run", power, cfg, None, 2), 1024, ("linear",))) == 1  # no RoPE softmax
    with pytest.raises(ValueError, match=r"scalings\[i\] must be one of \('linear', 'llama3'\), got 'ntk'"):
        rope_variants(trained, 1024, ("ntk",))


@pytest.mark.parametrize(
    "argv, match",
    [
        (["text", "/no/such/run"], r"runs must be run or export folders, got '/no/such/run'"),
        (["text", ".", "--length", "0"], r"--length must be an int >= 1, got 0"),
        (["text", ".", "--docs", "0"], r"--docs must be an int >= 1, got 0"),
        (["recall", ".", "--queries", "0"], r"--queries must be an int >= 1, got 0"),
        (["recall", ".", "--gap-fraction", "1"], r"--gap-fraction must be a finite number in \[0, 1\), got 1.0"),
        (["recall", ".", "--lengths", "1"], r"--lengths\[i\] must be an int >= 2, got 1"),
        (["recall", ".", "--segment", "0"], r"--segment must be an int >= 1, got 0"),
    ],
)
def test_bad_flags_are_refused_before_any_run_is_read(argv, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        main([*argv, "--out", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()
