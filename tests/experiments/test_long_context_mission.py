"""`python -m experiments.long_context mission`: the one table and figure from a text result and recall results,
on small JSONs written here (the numbers are chosen so the expected cells are known by hand)."""

import json

import pytest

from experiments.long_context.__main__ import main
from experiments.long_context.mission import mission_rows, recall_spread

MACHINE = {"device": "cpu", "date": "2026-12-04"}


def text_row(name: str, rope: str, bpb: list[float], cache_bytes: int, seconds: float) -> dict:
    buckets = [{"lo": lo, "hi": hi, "bits_per_byte": b} for (lo, hi), b in zip(((0, 512), (512, 1024)), bpb)]
    label = name if rope == "as trained" else f"{name}, RoPE {rope}"
    return {
        "name": name,
        "rope": rope,
        "label": label,
        "bits_per_byte": sum(bpb) / 2,
        "buckets": buckets,
        "cache_bytes": cache_bytes,
        "seconds": seconds,
        "tokens": 2048,
    }


def recall_row(run: str, name: str, task: str, metric: dict[int, float], rope: str = "as trained") -> dict:
    key = "accuracy" if task == "mqar" else "exact_match"
    cells = {str(L): {key: v, "queries": 512} for L, v in metric.items()}
    return {"run": run, "name": name, "label": f"{name} ({task})", "rope": rope, "task": task, "lengths": cells}


def recall_result(models: list[dict], lengths: list[int]) -> dict:
    setting = {"queries": 512, "gap_fraction": 0.5, "batch_tokens": 4096}
    return {
        "command": "python -m experiments.long_context recall ...",
        "machine": MACHINE,
        "lengths": lengths,
        **setting,
        "models": models,
    }


TEXT = {
    "command": "python -m experiments.long_context text ...",
    "machine": MACHINE,
    "length": 1024,
    "documents": {"count": 2},
    "models": [
        text_row("softmax", "as trained", [3.0, 5.0], 2**20, 2.048),
        text_row("softmax", "llama3", [3.0, 2.5], 2**20, 4.096),
        text_row("power", "as trained", [3.1, 2.6], 2**16, 0.2048),
    ],
}
RECALLS = [
    recall_result(
        [
            recall_row("mqar/power/seed0", "power", "mqar", {256: 0.9, 1024: 0.5}),
            recall_row("mqar/power/seed1", "power", "mqar", {256: 0.7, 1024: 0.1}),
            recall_row("mqar/power/seed2", "power", "mqar", {256: 0.2}),
            recall_row("mqar/gla/seed0", "gla", "mqar", {256: 0.4, 1024: 0.3}),
        ],
        [256, 1024],
    ),
    recall_result(
        [
            recall_row("mqar/softmax/seed0", "softmax", "mqar", {256: 0.6}),
            recall_row("mqar/softmax/seed0", "softmax", "mqar", {256: 0.8}, rope="llama3"),
            recall_row("passkey/power/seed0", "power", "passkey", {256: 1.0}),
        ],
        [256],
    ),
]


def test_recall_spread_is_mean_and_range_over_the_runs_at_each_length():
    mqar = recall_spread(RECALLS, "mqar")
    assert mqar[("power", "as trained")][256] == pytest.approx((0.6, 0.2, 0.9, 3))
    assert mqar[("power", "as trained")][1024] == pytest.approx((0.3, 0.1, 0.5, 2))  # seed2 was not read at 1k
    assert mqar[("softmax", "llama3")] == {256: pytest.approx((0.8, 0.8, 0.8, 1))}  # a reading of its own
    assert recall_spread(RECALLS, "passkey") == {("power", "as trained"): {256: (1.0, 1.0, 1.0, 1)}}


def test_rows_join_text_and_recall_by_name_and_reading():
    rows = mission_rows(TEXT, RECALLS)
    assert [(r["name"], r["rope"]) for r in rows] == [
        ("softmax", "as trained"),
        ("softmax", "llama3"),
        ("power", "as trained"),
        ("gla", "as trained"),  # recall only: after the text models
    ]
    power = rows[2]
    assert power["last_bucket"] == (512, 1024, 2.6)
    assert power["seconds_per_token"] == pytest.approx(1e-4)
    assert power["passkey"] == {256: (1.0, 1.0, 1.0, 1)}
    assert rows[3]["bits_per_byte"] is None and rows[3]["cache_bytes"] is None
    assert rows[1]["mqar"][256] == pytest.approx((0.8, 0.8, 0.8, 1))


def test_the_page_and_figure_are_written(tmp_path):
    text, recalls = tmp_path / "text.json", [tmp_path / "a.json", tmp_path / "b.json"]
    text.write_text(json.dumps(TEXT))
    for path, result in zip(recalls, RECALLS):
        path.write_text(json.dumps(result))
    out = tmp_path / "page" / "mission.md"
    main(["mission", "--text", str(text), "--recall", *map(str, recalls), "--out", str(out)])
    page = out.read_text()
    assert out.with_suffix(".png").stat().st_size > 0
    lines = {line.split(" | ")[0].lstrip("| "): line for line in page.splitlines() if line.startswith("| ")}
    assert "| 0.600 (0.200-0.900, 3 runs) | 0.300 (0.100-0.500, 2 runs) | 1.000 | - |" in lines["power"]
    assert "| 64 KiB | 100 us |" in lines["power"]
    assert lines["softmax, RoPE llama3"].startswith("| softmax, RoPE llama3 | 2.750 | 2.500 | 0.800 | - |")
    assert "| gla (mqar) | - | - | 0.400 | 0.300 |" in lines["gla (mqar)"]


def test_a_missing_json_is_refused_by_its_flag(tmp_path):
    text = tmp_path / "text.json"
    text.write_text(json.dumps(TEXT))
    with pytest.raises(ValueError, match="--recall must be a JSON this command wrote, got .*nope.json"):
        main(["mission", "--text", str(text), "--recall", str(tmp_path / "nope.json")])
    with pytest.raises(ValueError, match="--text must be a JSON this command wrote"):
        main(["mission", "--text", str(tmp_path), "--recall", str(text)])


def test_a_task_no_result_read_has_no_columns(tmp_path):
    text, recall = tmp_path / "text.json", tmp_path / "mqar.json"
    text.write_text(json.dumps(TEXT))
    recall.write_text(json.dumps(RECALLS[0]))  # MQAR rows only
    out = tmp_path / "mission.md"
    main(["mission", "--text", str(text), "--recall", str(recall), "--out", str(out)])
    header = next(line for line in out.read_text().splitlines() if line.startswith("| model"))
    assert "MQAR @256 | MQAR @1k |" in header and "passkey" not in header
