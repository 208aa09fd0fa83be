"""The prefix-reuse figure (experiments/prefix_reuse.py), drawn from made-up rows of prefix_reuse.json: one color
per model in every panel, and every panel's y axis names its quantity and unit."""

import json

import pytest

from experiments.prefix_reuse import KINDS, figure, main

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration


def made_up_results() -> dict:
    """{model: rows} as measure() writes them; the longest prefix's recompute was not timed (None)."""
    row = lambda n, i: {
        "prefix_len": n,
        "bytes_per_cached_prefix": 75028 * (i + 1) * (n // 1024 if i else 1),
        "recompute": {"ttft_s": 1e-4 * n, "total_s": 2e-4 * n} if n < 16384 else None,
        "snapshot": {"prefill_once_s": 1e-4 * n, "ttft_s": 0.04 + 0.01 * i, "total_s": 0.05},
    }
    return {kind: [row(n, i) for n in (1024, 4096, 16384)] for i, kind in enumerate(KINDS)}


def test_one_color_per_model_in_every_panel_and_labelled_y_axes():
    axes = figure(made_up_results()).axes
    colors = {}  # model -> the colors of its lines, over both panels
    for ax in axes:
        for line in ax.lines:
            kind = line.get_label().removesuffix(" snapshot").removesuffix(" recompute")
            colors.setdefault(kind, set()).add(line.get_color())
    assert set(colors) == set(KINDS) and all(len(c) == 1 for c in colors.values()), colors
    assert len({c for cs in colors.values() for c in cs}) == len(KINDS)  # and no two models share one
    assert len(axes) == 2 and all(ax.get_ylabel() for ax in axes)
    assert [ax.get_ylabel() for ax in axes] == ["cached prefix (MiB)", "time to first token (ms)"]


def test_plot_only_redraws_the_png_from_the_json(tmp_path):
    out = tmp_path / "prefix_reuse.json"
    out.write_text(json.dumps({"machine": {}, "setup": {}, "results": made_up_results()}))
    main(["--plot-only", "--out", str(out)])
    assert (tmp_path / "prefix_reuse.png").stat().st_size > 10_000
