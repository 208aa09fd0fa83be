"""`python -m experiments.long_context mission`: the one table and figure from a text result and recall results,
on small JSONs written here (the numbers are chosen so the expected cells are known by hand)."""

import json

import pytest

from experiments.long_context import mission
from experiments.long_context.__main__ import main
from experiments.long_context.mission import mission_rows, recall_spread
from experiments.long_context.report import text_groups

MACHINE = {"device": "cpu", "date": "2026-12-04"}


def text_row(name: str, rope: str, bpb: list[float], cache_bytes: int, seconds: float, seed: int = 0) -> dict:
    buckets = [{"lo": lo, "hi": hi, "bits_per_byte": b} for (lo, hi), b in zip(((0, 512), (512, 1024)), bpb)]
    label = name if rope == "as trained" else f"{name}, RoPE {rope}"
    return {
        "run": f"text/{name}/lr0.01/seed{seed}",
        "trained_length": 256,
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


def test_a_models_text_runs_are_one_row_of_mean_and_range():
    """Three seeds of power's text run: one row whose bits per byte, last bucket and time per token are the mean
    over the seeds (range and count kept); the page's cells say so, and the figure draws the range as a band."""
    seeds = [
        text_row("power", "as trained", bpb, 2**16, seconds, seed=i)
        for i, (bpb, seconds) in enumerate((([3.1, 2.6], 0.2048), ([3.3, 2.4], 0.4096), ([3.2, 2.2], 0.6144)))
    ]
    text = {**TEXT, "models": [TEXT["models"][0], *seeds]}
    rows = mission_rows(text, RECALLS)
    assert [(r["name"], r["rope"]) for r in rows] == [
        ("softmax", "as trained"),
        ("power", "as trained"),
        ("gla", "as trained"),  # recall only: after the text models, in the recall JSONs' order
        ("softmax", "llama3"),
    ]
    power = rows[1]
    assert power["bits_per_byte"] == pytest.approx((2.8, 2.7, 2.85, 3))  # each seed's mean of its two buckets
    assert power["last_bucket"][:2] == (512, 1024)
    assert power["last_bucket"][2] == pytest.approx((2.4, 2.2, 2.6, 3))
    assert power["seconds_per_token"] == pytest.approx(2e-4)
    assert rows[0]["bits_per_byte"] == (4.0, 4.0, 4.0, 1)


def test_the_page_and_figure_show_a_models_seeds_as_mean_and_range(tmp_path, monkeypatch):
    seeds = [
        text_row("power", "as trained", bpb, 2**16, 0.2048, seed=i) for i, bpb in enumerate(([3.1, 2.6], [3.3, 2.4]))
    ]
    path, out = tmp_path / "text.json", tmp_path / "mission.md"
    path.write_text(json.dumps({**TEXT, "models": seeds}))
    (tmp_path / "r.json").write_text(json.dumps(RECALLS[0]))
    drawn = []
    monkeypatch.setattr(mission, "save", lambda fig, p: drawn.append(fig) or p.name)
    main(["mission", "--text", str(path), "--recall", str(tmp_path / "r.json"), "--out", str(out)])
    line = next(line for line in out.read_text().splitlines() if line.startswith("| power |"))
    assert line.startswith("| power | 2.850 (2.850-2.850, 2 runs) | 2.500 (2.400-2.600, 2 runs) |")
    loss_ax = drawn[0].axes[0]
    (mean,) = [line for line in loss_ax.get_lines() if line.get_label().startswith("power")]
    assert mean.get_label() == "power, mean of 2 runs"
    assert list(mean.get_ydata()) == pytest.approx([3.2, 2.5])
    assert len(loss_ax.collections) == 1  # the band between the seeds


def test_text_rows_read_at_other_positions_are_refused():
    other = text_row("power", "as trained", [3.1, 2.6], 2**16, 0.2, seed=1)
    other["buckets"][1]["hi"] = 2048
    with pytest.raises(ValueError, match="seed0'.*seed1'.*other positions"):
        text_groups([text_row("power", "as trained", [3.1, 2.6], 2**16, 0.2), other])


def test_rows_join_text_and_recall_by_name_and_reading():
    rows = mission_rows(TEXT, RECALLS)
    assert [(r["name"], r["rope"]) for r in rows] == [
        ("softmax", "as trained"),
        ("softmax", "llama3"),
        ("power", "as trained"),
        ("gla", "as trained"),  # recall only: after the text models
    ]
    power = rows[2]
    assert power["last_bucket"] == (512, 1024, (2.6, 2.6, 2.6, 1))
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
