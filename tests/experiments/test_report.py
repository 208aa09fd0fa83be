"""The comparison report (experiments/compare/report.py) on a made-up comparison with known numbers: the best
learning rate per entry (ties, a diverged run), means and ranges over seeds, notes for lengths not run, the
headline, the ablation deltas, the frontier's order and bytes, the speed ratios, the plots and the appendix of
commands."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiments.compare.report import write_report
from experiments.compare.report_frontier import fixed_state_verdicts
from experiments.compare.results import Cell, Results, recipe_text

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration

LRS = [1e-3, 3e-3, 1e-2]
SELECTION = {  # first-seed accuracy on the selection split at each lr
    "softmax": [0.5, 0.9, 0.7],  # best 3e-3
    "power": [0.3, 0.3, math.nan],  # a tie goes to the smaller lr; the diverged run loses
    "power_nogate": [0.2, 0.1, 0.4],  # best 1e-2
}
TEST = {  # test accuracy per seed at the best lr: {length: [seed 0, 1, 2]}
    "softmax": {"64": [0.9, 0.8, 1.0], "1024": [0.5, 0.6, 0.7], "4096": "not run: time"},
    "power": {"64": [0.3, 0.2, 0.4], "1024": [0.25, 0.25, 0.25], "4096": [0.2, 0.2, 0.2]},
    "power_nogate": {"64": [0.1], "1024": [0.05], "4096": [0.05]},
    "softmax_kv4": {"64": [0.85, 0.75, 0.95], "1024": [0.2, 0.25, 0.15]},
    "power_state_int8": {"64": [0.25, 0.2, 0.3], "1024": [0.3, 0.3, 0.3]},
}
BYTES = {  # decode-state bytes at each frontier length: the caches grow, power's state does not
    "softmax": {"64": 16908, "1024": 262_000},
    "power": {"64": 5188, "1024": 5188},
    "power_nogate": {"64": 5188, "1024": 5188},
    "softmax_kv4": {"64": 3596, "1024": 50_000},
    "power_state_int8": {"64": 1500, "1024": 1500},
}
KINDS = {"softmax": "AA", "power": "PP", "power_nogate": "PP"}
BEST = {"softmax": 3e-3, "power": 1e-3, "power_nogate": 1e-2, "softmax_kv4": 3e-3, "power_state_int8": 1e-3}


def made_up_test(entry: str, seed: int) -> dict:
    out = {}
    for L, values in TEST[entry].items():
        out[L] = {"skipped": values} if isinstance(values, str) else {"accuracy": values[seed], "loss": 1.0}
    return out


def fake_quality(runs_dir: Path) -> dict:
    """quality.json of a made-up mqar comparison."""
    rng = np.random.default_rng(0)
    entries = {
        "softmax": {"group": "softmax", "base": None, "change": "", "kv_cache_bits": None},
        "power": {"group": "power", "base": None, "change": "", "kv_cache_bits": None},
        "power_nogate": {"group": "power", "base": "power", "change": "no gating", "kv_cache_bits": None},
        "softmax_kv4": {"group": "softmax", "base": "softmax", "change": "4-bit KV cache", "kv_cache_bits": 4},
        "power_state_int8": {
            "group": "power",
            "base": "power",
            "change": "int8 state",
            "kv_cache_bits": None,
            "state_format": "int8",
        },
    }
    runs = []
    for entry, values in SELECTION.items():
        seeds = (0, 1, 2) if entry in ("softmax", "power") else (0,)
        for lr, value in zip(LRS, values):
            for seed in seeds if lr == BEST[entry] else (0,):
                folder = runs_dir / entry / f"lr{lr:g}" / f"seed{seed}"
                summary = {
                    "seq_len": 64,
                    "steps": 10,
                    "layer_kinds": KINDS[entry],
                    "params": 1000 + len(entry),
                    "eval": {"64": {"accuracy": value if seed == 0 else 0.0, "loss": 2.0}},
                    "eval_curve": [[5, value / 2], [10, value]],
                    "rule": {"metric": "accuracy"},
                }
                if entry == "softmax":  # the convergence rule's account: seeds 0 and 1 converged, seed 2 hit the cap
                    summary.update(stopped_at=8 + 2 * seed, stop_reason="converged" if seed < 2 else "steps")
                test = made_up_test(entry, seed) if lr == BEST[entry] else None
                if entry == "softmax" and lr == 1e-3:
                    test = {"64": {"accuracy": 0.0}}  # a test eval off the best lr is never read
                command = f"python train.py model={entry} optim.lr={lr:g} seed={seed}"
                record = {"wall_s": 12.0, "command": command}
                runs.append(
                    dict(
                        task="mqar",
                        entry=entry,
                        lr=lr,
                        seed=seed,
                        folder=str(folder),
                        record=record,
                        summary=summary,
                        test=test,
                        train_curve=[(2 * i, 3.0 * i, float(5 - i + rng.uniform())) for i in range(1, 6)],
                    )
                )  # fmt
    for seed in (0, 1, 2):
        for entry in ("softmax_kv4", "power_state_int8"):  # each evaluates its base's runs at its best lr
            base = entries[entry]["base"]
            record = {"evaluates": f"{base}/lr{BEST[base]:g}/seed{seed}"}
            runs.append(
                dict(
                    task="mqar",
                    entry=entry,
                    lr=BEST[base],
                    seed=seed,
                    folder="-",
                    record=record,
                    summary=None,
                    test=made_up_test(entry, seed),
                )
            )  # fmt
    task = {
        "data": "mqar",
        "seq_len": 64,
        "tokens_per_run": 10 * 4 * 64,
        "num_kv_pairs": 4,
        "vocab_size": 80,
        "min_gap": 40,
        "matched_window": 19,
        "lrs": LRS,
        "seeds": [0, 1, 2],
        "entries": list(entries),
        "cache_bytes": {e: b["64"] for e, b in BYTES.items()},
        "cache_bytes_by_length": BYTES,
    }
    roles = {
        "headline": ["softmax", "power"],
        "ablations": ["power_nogate"],
        "frontier": ["softmax_kv4", "power_state_int8"],
    }
    roles["frontier_tasks"] = ["mqar"]
    machine = {"device": "cpu", "backend": "cpu", "devices": 1, "cpus": 2, "jax": "0", "date": "today"}
    return {
        "preset": "fake",
        "machine": machine,
        "command": "made up",
        "tasks": {"mqar": task},
        "entries": entries,
        "roles": roles,
        "runs": runs,
        "runs_dir": str(runs_dir),
    }


def fake_speed() -> dict:
    step_s = {"softmax": {1024: 0.5, 4096: 3.0}, "power": {1024: 0.75, 4096: 1.2}}
    row = lambda T, s: {"T": T, "batch": 4096 // T, "step_s": s, "tokens_per_s": 4096 / s, "peak_fraction": 0.1}
    results = {
        m: {
            "layer_kinds": KINDS[m],
            "train": [{**row(T, s), "temp_bytes": 3 * 2**20} for T, s in step_s[m].items()],
            "decode": {"1024": {"ms_per_token": 2.0 if m == "softmax" else 0.5}},
            "cache_bytes": {"1024": 2**20 if m == "softmax" else 2**15},
        }
        for m in step_s
    }
    machine = {"device": "cpu", "backend": "cpu", "devices": 1, "cpus": 2, "jax": "0", "date": "today"}
    return {"preset": "fake", "machine": machine, "command": "speed cmd", "matched_window": 19, "results": results}


@pytest.fixture
def report(tmp_path) -> tuple[str, Path]:
    data = tmp_path / "data"
    data.mkdir()
    (data / "quality.json").write_text(json.dumps(fake_quality(tmp_path / "runs")))
    (data / "speed.json").write_text(json.dumps(fake_speed()))
    write_report(data, tmp_path / "REPORT.md", op_speed=None)
    return (tmp_path / "REPORT.md").read_text(), data


def test_best_lr_per_entry_ties_and_divergence(tmp_path):
    res = Results(fake_quality(tmp_path))
    assert {e: res.best_lr("mqar", e) for e in BEST} == BEST
    assert res.sweep("mqar", "softmax") == dict(zip(LRS, SELECTION["softmax"]))


def test_a_one_rate_grid_reports_seeds_without_its_first(tmp_path):
    """A grid of one rate chooses it at once: a report of seeds 1 and 2 alone (`run.py --only seed=1`, the first
    seed's run folders gone) tables their cells, not 'pending (lr sweep)'."""
    quality = fake_quality(tmp_path)
    quality["tasks"]["mqar"]["lrs"] = [BEST["softmax"]]
    quality["runs"] = [r for r in quality["runs"] if r["entry"] == "softmax" and r["lr"] == BEST["softmax"]]
    quality["runs"] = [r for r in quality["runs"] if r["seed"] > 0]
    res = Results(quality)
    assert res.best_lr("mqar", "softmax") == BEST["softmax"]
    assert res.cell("mqar", "softmax", 1024).text() == "0.650 (0.600-0.700)"


def test_cells_are_means_and_ranges_over_the_best_lr_seeds(tmp_path):
    res = Results(fake_quality(tmp_path))
    cell = res.cell("mqar", "softmax", 64)
    assert (cell.n, cell.lo, cell.hi) == (3, 0.8, 1.0) and cell.mean == pytest.approx(0.9)
    assert cell.text() == "0.900 (0.800-1.000)"
    assert res.cell("mqar", "power_nogate", 64).text() == "0.100"  # one seed: no range
    assert res.cell("mqar", "softmax", 4096).text() == "not run: time"
    assert res.cell("mqar", "softmax_kv4", 4096).text() == "-"  # evaluated at the training length only
    assert Cell().text() == "pending"
    res.tasks["mqar"]["entries"].remove("power_nogate")  # a task that leaves an entry out says so
    assert res.cell("mqar", "power_nogate", 64).text() == "not run on this task"


def test_report_tables(report):
    text, _ = report
    softmax = "| softmax (AA) | 1,007 | 0.003 | 8-12 (2/3) | 0.900 (0.800-1.000) | 0.600 (0.500-0.700) | not run: "
    assert softmax in text  # stopped at 8, 10 (converged) and 12 (the cap)
    power = "| power (PP) | 1,005 | 0.001 | - | 0.300 (0.200-0.400) | 0.250 (0.250-0.250) | 0.200 (0.200-0.200) |"
    assert power in text  # summaries without the rule's keys
    assert "| softmax | 0.500 | **0.900** | 0.700 |" in text  # the lr sweep, best in bold
    assert "| power | **0.300** | 0.300 | nan |" in text
    row = "| power_nogate | no gating | power (PP) | 0.300 (0.200-0.400) | 0.100 | -0.200 |"
    assert row in text  # the ablation: base, ablated, change


def test_report_headline_buys_and_costs(report):
    text, _ = report
    header = "| model (layers) | train-step speed-up at 4k | decode ms/token at 1k | cache there |"
    assert header + " mqar accuracy @64 | mqar accuracy @1k | mqar accuracy @4k |" in text
    assert "| power (PP) | 2.5x | 0.5 (4x) | 32 KiB | 0.300 (0.200-0.400) | 0.250 (0.250-0.250) |" in text
    assert "| softmax (AA) | 1x | 2 (1x) | 1.0 MiB | 0.900 (0.800-1.000) |" in text


def test_report_frontier_by_length_and_the_fixed_state_verdict(report):
    """Rows sorted by bytes at the training length, bytes at the first and last length, accuracy at each, each
    quantized entry labelled with how it stores its memory; power's fixed 5,188 bytes beat the 4-bit cache at
    1,024 tokens (0.25 > 0.2 with 5 KiB <= 49 KiB), not at 64 (the cache is smaller there: 3,596 bytes); its int8
    state's 1,500 bytes are below the cache's accuracy at 64 and beat it at 1,024."""
    text, _ = report
    frontier = text[text.index("## The frontier") : text.index("## Learning-rate")]
    rows = [line for line in frontier.splitlines() if line.startswith("| ") and "@64" not in line]
    names = ["| power_state_int8 (PP, state int8)", "| softmax_kv4 (AA, KV 4-bit)", "| power (PP)", "| softmax (AA)"]
    assert [r.split(" | ")[0] for r in rows[:4]] == names
    assert "| softmax_kv4 (AA, KV 4-bit) | 4 KiB | 49 KiB | 0.850 (0.750-0.950) | 0.200 (0.150-0.250) |" in frontier
    assert (
        "| power_state_int8 (PP, state int8) | 1 KiB | 1 KiB | 0.250 (0.200-0.300) | 0.300 (0.300-0.300) |" in frontier
    )
    assert "- power (PP), 5 KiB at every length: beats it at 1k; more bytes than the cache at 64" in frontier
    state = "- power_state_int8 (PP, state int8), 1 KiB at every length: beats it at 1k; below its accuracy at 64"
    assert state in frontier


def test_lr_table_flags_a_best_at_the_grid_edge(report):
    """power's best (1e-3) and power_nogate's (1e-2) sit at the grid's edges: flagged; softmax's (3e-3) does
    not."""
    text, _ = report
    sweeps = text[text.index("## Learning-rate") :]
    rows = {line.split(" | ")[0][2:]: line for line in sweeps.splitlines() if line.startswith("| ")}
    assert rows["power"].endswith("| edge |") and rows["power_nogate"].endswith("| edge |")
    assert rows["softmax"].endswith("|  |")


def test_report_speed_protocol_plots_and_commands(report):
    text, data = report
    assert "| power (PP) | 0.75 s (0.67x) | 1.2 s (2.5x) |" in text  # softmax's time over power's
    assert (
        "| mqar | T=64, 4 pairs, vocab 80, queries >= 40 tokens after | 2,560 | 0.001, 0.003, 0.01 | 0, 1, 2 |" in text
    )
    assert "`python train.py model=power optim.lr=0.001 seed=2`" in text  # the appendix
    assert "Made by `made up`, `speed cmd`." in text and "No training-loss curve" not in text
    for png in ("speed.png", "quality_mqar.png", "frontier.png", "curves.png"):
        assert (data / png).stat().st_size > 10_000
        assert f"(data/{png})" in text  # linked relative to the report


def test_tasks_without_training_curves_are_named(tmp_path):
    """Runs carried over from a quality.json that kept no training-loss curves: the report says so for the task
    (the figure is still drawn)."""
    quality = fake_quality(tmp_path / "runs")
    for run in quality["runs"]:
        run.pop("train_curve", None)
    (tmp_path / "quality.json").write_text(json.dumps(quality))
    (tmp_path / "speed.json").write_text(json.dumps(fake_speed()))
    write_report(tmp_path, tmp_path / "REPORT.md", op_speed=None)
    text = (tmp_path / "REPORT.md").read_text()
    assert "No training-loss curve for mqar: those runs were collected before" in text
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_report_without_results_says_what_to_run(tmp_path):
    with pytest.raises(SystemExit, match="run python -m experiments.compare.run"):
        write_report(tmp_path, tmp_path / "R.md")


def test_a_tie_with_the_4bit_cache_is_not_a_win(tmp_path):
    """power at 0.25 against a 4-bit cache at 0.25 on every seed at 1,024 tokens: a tie, not a win."""
    quality = fake_quality(tmp_path)
    for run in quality["runs"]:
        if run["entry"] == "softmax_kv4":
            run["test"]["1024"]["accuracy"] = 0.25
    verdicts = fixed_state_verdicts(Results(quality), "mqar", [64, 1024])
    power = "- power (PP), 5 KiB at every length: beats it at no length; ties at 1k; more bytes than the cache at 64"
    assert power in verdicts


def test_op_section_puts_the_matrix_state_ops_beside_power_and_softmax():
    """experiments/op_speed.py's rows (made up): one column per matrix-state op measured, '-' at a length it was not
    run, softmax / power from the same row, and the ops' decode steps in words."""
    from experiments.compare.report_speed import op_section

    train = lambda name, T, s: dict(kind="train", name=name, T=T, fwd_bwd_s=s, gflops_fwd_bwd=10.0)
    op = dict(
        config=dict(batch=1, heads=8, head_dim=64),
        matmul_gflops=100.0,
        machine=dict(backend="cpu", cpus=2),
        rows=[
            train("power c=128", 1024, 0.2),
            train("softmax blockwise", 1024, 0.1),
            train("gla c=64", 1024, 0.3),
            train("power c=128", 65536, 15.0),
            train("softmax blockwise", 65536, 90.0),
            dict(kind="decode", T=65536, power_ms_per_token=0.3, kv_ms_per_token=27.0, speedup=90.0, byte_ratio=62.0),
            dict(kind="decode_op", name="gla", ms_per_token=0.05, state_bytes=131072),
        ],
    )
    text = "\n".join(op_section(op))
    assert "| T | power c=128 | softmax | GLA c=64 | softmax / power | power % of matmul rate |" in text
    assert "| 1k | 0.2 s | 0.1 s | 0.3 s | 0.5x | 10% |" in text
    assert "| 64k | 15 s | 90 s | - | 6x | 10% |" in text
    assert "GLA 0.05 ms (128 KiB)" in text


def with_task(quality: dict, task: str, change) -> dict:
    """`quality` with a copy of its mqar task named `task`, each run passed through `change` (a run dict)."""
    quality["tasks"][task] = dict(quality["tasks"]["mqar"])
    quality["runs"] += [change({**r, "task": task}) for r in quality["runs"] if r["task"] == "mqar"]
    return quality


@pytest.fixture
def figures(monkeypatch) -> dict:
    """{file name: Figure} of every PNG the report writes."""
    import experiments.compare.report_quality as report_quality

    saved, save = {}, report_quality.save

    def record(fig, path: Path) -> str:
        saved[path.name] = fig
        return save(fig, path)

    monkeypatch.setattr(report_quality, "save", record)
    return saved


def test_curves_draw_only_panels_with_curves(tmp_path, figures):
    """A task whose runs kept no training-loss curve (carried over) gets its held-out panel only: every axes
    of curves.png has a curve, and there are 3 + 1 of them (no empty panel with a note in it)."""
    no_train_curve = lambda run: {key: value for key, value in run.items() if key != "train_curve"}
    quality = with_task(fake_quality(tmp_path / "runs"), "carried", no_train_curve)
    (tmp_path / "quality.json").write_text(json.dumps(quality))
    write_report(tmp_path, tmp_path / "REPORT.md", op_speed=None)
    axes = figures["curves.png"].axes
    assert [ax.get_title() for ax in axes if ax.lines] == [ax.get_title() for ax in axes]
    assert len(axes) == 4 and sum("carried" in ax.get_title() for ax in axes) == 1
    assert "No training-loss curve for carried: " in (tmp_path / "REPORT.md").read_text()


def test_a_task_evaluated_once_is_tabled_not_drawn(tmp_path, figures):
    """A smoke test's task (each run evaluated once, as the cpu preset's 60-step text runs): its table stays, no
    quality plot, no column in the training curves, and the report says why."""

    def once(run: dict) -> dict:
        summary = run["summary"] and {**run["summary"], "eval_curve": run["summary"]["eval_curve"][-1:]}
        return {**run, "summary": summary}

    quality = with_task(fake_quality(tmp_path / "runs"), "smoke", once)
    (tmp_path / "quality.json").write_text(json.dumps(quality))
    write_report(tmp_path, tmp_path / "REPORT.md", op_speed=None)
    text = (tmp_path / "REPORT.md").read_text()
    assert "### smoke: test accuracy" in text and "No plots of smoke (here, by position or in the training" in text
    assert "quality_smoke.png" not in figures and (tmp_path / "quality_mqar.png").exists()
    assert not any("smoke" in ax.get_title() for ax in figures["curves.png"].axes)


def test_a_model_is_named_with_each_kinds_recipe_as_its_layers_are_built():
    """The recipe beside a model's layers is read per kind through LMConfig.for_kind from the run's resolved model:
    a per-layer setting wins over the global one, and each kind names only the fields its registry entry lists."""
    model = {"pattern": "PA", "n_layers": 2, "rope_base": 10000.0, "deg": 4, "decay_init": "paper"}
    hybrid = {**model, "layers": {"P": {"rope_base": None}}}
    assert recipe_text(hybrid, "PA") == "P: no RoPE, degree 4 / A: RoPE"
    assert recipe_text(model, "PA") == "P: RoPE, degree 4 / A: RoPE"
    assert recipe_text({**model, "pattern": "D", "layers": {"D": {"decay_init": "long"}}}, "DD") == "long decay init"
    assert recipe_text({**model, "pattern": "M"}, "MM") == "paper decay init"
    run = {"task": "t", "entry": "power", "lr": 0.01, "seed": 0, "summary": {"layer_kinds": "PP"}}
    quality = {"tasks": {}, "entries": {"power": {"kv_cache_bits": None}}, "roles": {}}
    assert Results({**quality, "runs": [run]}).layers("t", "power") == "PP"  # no resolved model kept: kinds alone
    kept = Results({**quality, "runs": [{**run, "model": {**hybrid, "pattern": "P"}}]})
    assert kept.layers("t", "power") == "PP, no RoPE, degree 4"


def test_the_quality_figure_names_its_metric_and_each_model(tmp_path, figures):
    """quality_<task>.png: the y axis is the task's test metric, the legend each headline model with its layers."""
    (tmp_path / "quality.json").write_text(json.dumps(fake_quality(tmp_path / "runs")))
    write_report(tmp_path, tmp_path / "REPORT.md", op_speed=None)
    ax = figures["quality_mqar.png"].axes[0]
    assert ax.get_ylabel() == "accuracy"
    assert {"softmax (AA)", "power (PP)"} <= {text.get_text() for text in ax.get_legend().get_texts()}
