"""The comparison's command (experiments/compare/run.py): --report-only with no finished run refuses, leaving the
committed report and data as they are."""

import pytest

from experiments.compare.run import main


def test_report_only_without_runs_keeps_the_committed_results(tmp_path, monkeypatch):
    """A fresh clone (results committed, no outputs/): `--preset cpu --report-only` exits non-zero naming the runs
    folder, and the report and quality.json are byte for byte what they were."""
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "results" / "compare" / "cpu"
    data.mkdir(parents=True)
    committed = {tmp_path / "results" / "REPORT.md": "# committed report\n", data / "quality.json": '{"runs": [1]}'}
    for path, text in committed.items():
        path.write_text(text)
    with pytest.raises(SystemExit) as stop:
        main(["--preset", "cpu", "--report-only"])
    assert stop.value.code not in (0, None) and "no finished run under outputs/compare/cpu" in str(stop.value.code)
    assert {path: path.read_text() for path in committed} == committed
    assert sorted(p.name for p in data.iterdir()) == ["quality.json"]
