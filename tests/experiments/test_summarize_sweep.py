"""The sweep table of `make demo` (experiments/summarize_sweep.py): one row per run's summary.json, with the
layers the trainer actually built."""

import json

from experiments.compare.models import compose_config, entry_overrides
from experiments.compare.presets import SMOKE
from experiments.summarize_sweep import load, table
from retention.train import train


def summary(model: str, layer_kinds: str, accuracy: dict[str, float]) -> dict:
    evals = {L: {"accuracy": a, "loss": 1.5} for L, a in accuracy.items()}
    cache = {"16": 100, "65536": 3 * 2**20}
    counts = {"params": 123456, "final_loss": 1.5, "tokens_per_s": 98765.4, "cache_bytes": cache}
    return {"model": model, "layer_kinds": layer_kinds, "eval": evals, **counts}


def test_table_rows_from_summaries(tmp_path):
    """Each run is a row in folder order; a length a run was not evaluated at shows as "-"."""
    for i, s in enumerate([summary("softmax", "AA", {"32": 0.25, "128": 0.125}), summary("hybrid", "PA", {"32": 1})]):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "summary.json").write_text(json.dumps(s))
    lines = table(load(str(tmp_path))).splitlines()
    assert lines[0].split() == "model layers params final loss acc@32 acc@128 tokens/s cache@64k".split()
    assert set(lines[1]) == {"-"}
    assert lines[2].split() == ["softmax", "AA", "123,456", "1.500", "0.250", "0.125", "98,765", "3.0", "MiB"]
    assert lines[3].split() == ["hybrid", "PA", "123,456", "1.500", "1.000", "-", "98,765", "3.0", "MiB"]


def test_a_pattern_repeated_over_the_layers_shows_the_built_layers(tmp_path):
    """The pattern PA over 5 layers builds PAPAP: the trainer's summary.json records it and the table shows it."""
    task = SMOKE.tasks["mqar"]
    model = [*entry_overrides("power", SMOKE, "mqar"), "model.name=hybrid", "model.pattern=PA", "model.n_layers=5"]
    cfg = compose_config([*model, f"data={task.data}", *task.overrides, "trainer.steps=3", "trainer.eval_scales=[1]"])
    written = train(cfg, str(tmp_path / "run0"))
    assert written["layer_kinds"] == "PAPAP"
    (row,) = table(load(str(tmp_path))).splitlines()[2:]
    assert row.split()[:2] == ["hybrid", "PAPAP"]
