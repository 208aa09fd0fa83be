"""The agent benchmark (experiments/agent_serving.py) at toy sizes: the workload (a shared system prompt, each turn's
prompt the previous one with its generated tokens and a new append), the cached fraction counted from the tokens
against the engine's cache_stats, the JSON's schema and the flags it refuses. Never on wall-clock time."""

import json

import pytest

from experiments.agent_serving import COLORS, expected_cached, figure, main, serve, tool_tokens, workload
from experiments.prefix_reuse import build
from retention.serve import Engine

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration

TOY = dict(sessions=3, turns=3, history=120, system=40, user=4, new=3)


def test_workload_sizes_the_last_prompt_to_the_history():
    work = workload(**TOY)
    assert work.sessions == 3 and work.turns == 3 and len(work.system) == 40
    tool = tool_tokens(120, 40, 3, 4, 3)
    assert all(len(a) == tool + 4 for appends in work.appends for a in appends)
    last = 40 + 3 * (tool + 4) + 2 * 3  # the last turn's prompt: the history, less under a turn's remainder
    assert 120 - 3 < last <= 120
    assert work.appends[0] != work.appends[1]  # each session its own tool outputs


@pytest.fixture(scope="module")
def served():
    """The toy workload served by a P engine with the prefix cache on (block 8): the trace and the engine."""
    work = workload(**TOY)
    engine = Engine(build("P"), slots=3, max_len=200, prefix_cache_bytes=1 << 26, prefix_block=8)
    return work, serve(engine, work), engine


def test_sessions_share_the_system_prompt_and_each_turn_extends_the_last(served):
    work, trace, _ = served
    assert [len(p) for p in trace.prompts] == [3, 3, 3] and len(trace.ttft_s) == 3
    for s in range(3):
        assert trace.prompts[0][s] == work.system + work.appends[s][0]
        for t in (1, 2):
            made = trace.generated[t - 1][s]
            assert len(made) == 3
            assert trace.prompts[t][s] == trace.prompts[t - 1][s] + made + work.appends[s][t]
    assert max(len(p) for p in trace.prompts[-1]) <= 120


def test_cached_fraction_from_the_token_counts_equals_the_engines(served):
    work, trace, engine = served
    lengths = [[len(p) for p in prompts] for prompts in trace.prompts]
    stats = engine.cache_stats()
    assert stats.evictions == 0
    assert expected_cached(len(work.system), lengths, 8) == stats.tokens_reused > 0
    assert stats.hits == 3 * 3 - 1  # all but the first request find a prefix


def test_the_cached_tokens_are_the_runs_without_the_cache(served):
    """The cache changes where the work is done, not the tokens: greedy answers equal the cache-off engine's."""
    work, trace, _ = served
    plain = serve(Engine(build("P"), slots=3, max_len=200), work)
    assert plain.generated == trace.generated


def test_the_json_schema_and_plot_only(tmp_path):
    out = tmp_path / "agent.json"
    main(
        ["--sessions", "1", "2", "--turns", "2", "--history", "100", "--system", "40", "--user", "4", "--new", "2"]
        + ["--block", "16", "--kinds", "P", "--out", str(out)]
    )
    data = json.loads(out.read_text())
    assert set(data) == {"machine", "setup", "results"}
    assert {"platform", "cpus", "jax_version", "device", "note"} <= set(data["machine"])
    assert data["setup"]["sessions"] == [1, 2] and data["setup"]["parameters"]["P"] > 0
    rows = data["results"]["P"]
    assert [r["sessions"] for r in rows] == [1, 2]
    for row in rows:
        on, off = row["cache_on"], row["cache_off"]
        assert on["cached_tokens"] == on["expected_cached_tokens"] > 0 and off["cached_tokens"] == 0
        assert 0 < on["cached_fraction"] < 1 and off["cached_fraction"] == 0
        assert on["prompt_tokens"] == off["prompt_tokens"] and on["generated_tokens"] == 2 * 2 * row["sessions"]
        for stats in (on, off):
            assert stats["ttft_s"]["median"] <= stats["ttft_s"]["p90"]
            assert [t["turn"] for t in stats["turns"]] == [0, 1]
            assert stats["slot_cache_bytes"] > 0 and stats["bytes_per_session"] > 0
            assert {"generated_tokens_per_s", "prompt_tokens_per_s", "seconds"} <= set(stats)
        assert on["prefix_cache"]["bytes_held"] > 0 == off["prefix_cache"]["bytes_held"]
    png = tmp_path / "agent.png"
    png.unlink()
    main(["--plot-only", "--out", str(out)])
    assert png.stat().st_size > 10_000


def made_up_results() -> dict:
    stats = lambda i: {
        "prefix_cache": {"bytes_held": 2**20 * (i + 1)},
        "slot_cache_bytes": 2**19,
        "generated_tokens_per_s": 100.0 / (i + 1),
        "turns": [{"turn": t, "prompt_tokens": 512.0 * (t + 1), "ttft_median_s": 0.01 * (t + 1)} for t in range(3)],
    }
    return {
        k: [{"sessions": n, "cache_on": stats(i), "cache_off": stats(i + 1)} for n in (2, 4)]
        for i, k in enumerate(COLORS)
    }


def test_one_color_per_model_and_labelled_axes():
    axes = figure(made_up_results()).axes
    colors = {}
    for ax in axes:
        for line in ax.lines:
            kind = line.get_label()
            for suffix in (" slots", " cache off", " cache on"):
                kind = kind.removesuffix(suffix)
            colors.setdefault(kind, set()).add(line.get_color())
    assert set(colors) == set(COLORS) and all(len(c) == 1 for c in colors.values()), colors
    assert len({c for cs in colors.values() for c in cs}) == len(COLORS)
    assert [ax.get_ylabel() for ax in axes] == ["bytes held (MiB)", "time to first token (ms)", "generated tokens/s"]
    assert all(ax.get_xlabel() for ax in axes)


@pytest.mark.parametrize(
    "flags, name",
    [
        (["--history", "50"], "--history"),
        (["--sessions", "2", "0"], "--sessions"),
        (["--turns", "0"], "--turns"),
        (["--new", "0"], "--new"),
        (["--block", "0"], "--block"),
        (["--repeats", "0"], "--repeats"),
        (["--cache-mib", "0"], "--cache-mib"),
    ],
)
def test_bad_flags_raise_naming_the_flag(flags, name, tmp_path):
    with pytest.raises(ValueError, match=name):
        main(flags + ["--system", "40", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
