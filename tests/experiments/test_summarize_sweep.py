"""The sweep table of `make demo` (experiments/summarize_sweep.py): one row per run's summary.json in job order,
the swept keys as columns, each row's accuracies at multiples of its own training length, and the layers the
trainer actually built; --csv and --json write the same rows' values unformatted."""

import csv
import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from experiments.compare.models import compose_config, entry_overrides
from experiments.compare.presets import SMOKE
from experiments.summarize_sweep import load, table
from retention.train import train
from tests.train.common import ROOT

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration


def summary(model: str, layer_kinds: str, seq_len: int, accuracy: dict[int, float]) -> dict:
    evals = {str(L): {"accuracy": a, "loss": 1.5} for L, a in accuracy.items()}
    cache = {"16": 100, "65536": 3 * 2**20}
    counts = {"params": 123456, "final_loss": 1.5, "tokens_per_s": 98765.4, "cache_bytes": cache, "steps": 7}
    return {"model": model, "layer_kinds": layer_kinds, "seq_len": seq_len, "eval": evals, **counts}


def write_run(folder, summary: dict, overrides: list[str]) -> None:
    (folder / ".hydra").mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    OmegaConf.save(OmegaConf.create(overrides), folder / ".hydra" / "overrides.yaml")


def write_sweep(folder) -> None:
    """Jobs 2 and 10 (they sort as numbers); seq_len and lr differ between the runs (swept), the model and the shared
    key do not; job 10 was evaluated at T and 4T, job 2 at T alone, and job 2 has no throughput."""
    runs = {
        "10_softmax": (summary("softmax", "AA", 32, {32: 0.25, 128: 0.125}), ["data.seq_len=32", "optim.lr=1e-3"]),
        "2_hybrid": (
            summary("hybrid", "PA", 64, {64: 1.0}) | {"tokens_per_s": None},
            ["data.seq_len=64", "optim.lr=3e-3"],
        ),
    }
    for name, (s, swept) in runs.items():
        write_run(folder / name, s, [f"model={s['model']}", "trainer.steps=7", *swept, "hydra.job.num=0"])


def test_rows_in_job_order_with_swept_keys_and_lengths_per_row(tmp_path):
    """Jobs 2 and 10 sort as numbers; seq_len and lr differ between the runs (swept: a column each), the model and
    the shared key do not; each row's acc@T and acc@4T are at its own lengths, "-" where it was not evaluated."""
    write_sweep(tmp_path)
    lines = table(load(str(tmp_path))).splitlines()
    header = "job seq_len lr model layers params T steps loss@T acc@T acc@4T tokens/s cache@64k"
    assert lines[0].split() == header.split()
    assert set(lines[1]) == {"-"}
    assert lines[2].split() == "2_hybrid 64 3e-3 hybrid PA 123,456 64 7 1.500 1.000 - - 3.0 MiB".split()
    assert lines[3].split() == "10_softmax 32 1e-3 softmax AA 123,456 32 7 1.500 0.250 0.125 98,765 3.0 MiB".split()


COLUMNS = "job data.seq_len optim.lr model layers params T steps loss@T acc@T acc@4T tokens/s cache_bytes@65536"
ROWS = [  # write_sweep's runs, by hand: None where a run was not evaluated or measured
    ["2_hybrid", "64", "3e-3", "hybrid", "PA", 123456, 64, 7, 1.5, 1.0, None, None, 3 * 2**20],
    ["10_softmax", "32", "1e-3", "softmax", "AA", 123456, 32, 7, 1.5, 0.25, 0.125, 98765.4, 3 * 2**20],
]


def test_csv_and_json_hold_the_rows_values(tmp_path):
    write_sweep(tmp_path / "sweep")
    command = [sys.executable, "-m", "experiments.summarize_sweep", tmp_path / "sweep"]
    command += ["--csv", tmp_path / "t.csv", "--json", tmp_path / "t.json"]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0].split()[:3] == ["job", "seq_len", "lr"]  # the table still prints
    records = json.loads((tmp_path / "t.json").read_text())
    assert [list(r) for r in records] == [COLUMNS.split()] * 2
    assert [list(r.values()) for r in records] == ROWS
    with open(tmp_path / "t.csv", newline="") as f:
        header, *rows = list(csv.reader(f))
    assert header == COLUMNS.split()
    assert rows == [["" if v is None else str(v) for v in row] for row in ROWS]


def test_a_run_without_overrides_has_no_swept_columns(tmp_path):
    """A folder that is one run (no .hydra/overrides.yaml) prints its row with no swept-key column."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary("power", "PP", 16, {16: 0.5, 64: 0.25})))
    lines = table(load(str(tmp_path))).splitlines()
    assert lines[0].split()[:2] == ["job", "model"]
    assert lines[2].split()[:2] == ["run", "power"] and lines[2].split()[-5:-3] == ["0.500", "0.250"]


def test_a_pattern_repeated_over_the_layers_shows_the_built_layers(tmp_path):
    """The pattern PA over 3 layers builds PAP: the trainer's summary.json records it and the table shows it."""
    model = [*entry_overrides("power", SMOKE, "mqar"), "model.name=hybrid", "model.pattern=PA", "model.n_layers=3"]
    cfg = compose_config([*model, "trainer.steps=3", "trainer.eval_scales=[1]"])
    written = train(cfg, str(tmp_path / "run0"))
    assert written["layer_kinds"] == "PAP"
    (row,) = table(load(str(tmp_path))).splitlines()[2:]
    assert row.split()[:3] == ["run0", "hybrid", "PAP"]
