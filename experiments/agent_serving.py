"""Agent serving: N sessions share a system prompt and run several turns each; every turn appends a tool output and
a user message to its session's history and the model answers, so each turn is a new request whose prompt is the
session's whole history (the previous prompt, the tokens generated for it, the new tool output and user message)
and most of its tokens were prompt tokens before. The Engine's automatic prefix cache (`prefix_cache_bytes`) finds
the cached prefix; the same workload with the cache off prefills every prompt whole. For P, softmax (A), softmax
with a 4-bit KV cache and a PA hybrid (prefix_reuse.py's small models, random weights: this measures serving, not
quality): the fraction of prompt tokens served from the cache, generated and prompt tokens per second, time to
first token per turn (median and p90), and the bytes held by the prefix cache and by the slots' caches against the
number of sessions.

Each turn's requests arrive together (one per session, `slots` = sessions) and a request's time to first token runs
from that arrival to its first token: the engine prefills joining prompts one after another, so it includes the
prefills queued before it. Times are medians of `--repeats` runs after a compiling one (a fresh engine each run,
the same tokens: greedy), experiments/timing.py.

    python -m experiments.agent_serving [--sessions 2 4] [--turns 3] [--history 2048] [--out results/agent_serving.json]
    python -m experiments.agent_serving --plot-only    # redraw results/agent_serving.png from the JSON

The issue's protocol, histories to 64k on a machine that allows it, many turns of short appends (about 93% of the
prompt tokens cached, near the 96% of real agent traffic); softmax's prefix cache holds each token's keys and
values once (an entry per block boundary, each holding its own block's: 65 MiB for a 64k-token session of these
models), and evictions under the budget, which lower the cached fraction, are in the JSON. Softmax recomputing
64k-token prompts with the cache off is the slow part (`--kinds` runs a subset, `--no-cache-off` skips that comparison):

    python -m experiments.agent_serving --sessions 1 4 8 --turns 32 --history 65536 --system 8192 --new 64 \\
        --block 1024 --cache-mib 65536 --note "idle"
"""

import argparse
import dataclasses
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from matplotlib.figure import Figure

from experiments.plotting import log_ticks, save
from experiments.prefix_reuse import BASE, COLORS, KINDS, MIB, build, parse_flags, redraw
from experiments.timing import machine, run_times
from retention.serve import Engine


@dataclasses.dataclass(frozen=True)
class Workload:
    """The tokens an agent workload adds, fixed before it runs (the generated tokens come from the engine).

    Attributes:
        system: the system prompt every session starts with.
        appends: appends[s][t], session s's tool output and user message at turn t.
        new: the tokens generated per turn.
    """

    system: list[int]
    appends: list[list[list[int]]]
    new: int

    @property
    def sessions(self) -> int:
        return len(self.appends)

    @property
    def turns(self) -> int:
        return len(self.appends[0])


def tool_tokens(history: int, system: int, turns: int, user: int, new: int) -> int:
    """The tokens of each tool output such that the last turn's prompt is `history` tokens: system + turns * (tool +
    user) + (turns - 1) * new.

    Raises:
        ValueError: naming --history when it leaves no room for a tool output of at least one token.
    """
    tool = (history - system - (turns - 1) * new) // turns - user
    if tool < 1:
        least = system + turns * (user + 1) + (turns - 1) * new
        raise ValueError(
            f"--history={history} leaves no room for a tool output: at least {least} tokens for --system={system}, "
            f"--turns={turns}, --user={user} and --new={new}"
        )
    return tool


def workload(sessions: int, turns: int, history: int, system: int, user: int, new: int, seed: int = 0) -> Workload:
    """Random tokens for a workload: one system prompt shared by every session, and per session and turn a tool
    output and a user message (tool_tokens(...) + user tokens), so the last turn's prompt is `history` tokens."""
    tool = tool_tokens(history, system, turns, user, new)
    key = jax.random.key(seed)
    system_ids = jax.random.randint(key, (system,), 0, BASE.vocab_size).tolist()
    appends = jax.random.randint(jax.random.fold_in(key, 1), (sessions, turns, tool + user), 0, BASE.vocab_size)
    return Workload(system_ids, appends.tolist(), new)


@dataclasses.dataclass
class Trace:
    """What one run of a workload did: prompts[t][s] and generated[t][s] (tokens), ttft_s[t][s] (seconds from the
    turn's arrival to the request's first token) and seconds (the whole run)."""

    prompts: list[list[list[int]]]
    generated: list[list[list[int]]]
    ttft_s: list[list[float]]
    seconds: float = 0.0


def serve(engine: Engine, work: Workload) -> Trace:
    """Run the workload through the engine, turn by turn: each session's request of a turn is its history (turn 0:
    the system prompt) with the tokens generated for its last prompt and this turn's append; a turn's requests are
    submitted together, in session order, and the next turn starts once every session has its answer."""
    trace = Trace([], [], [])
    begin = time.perf_counter()
    for t in range(work.turns):
        if t == 0:
            prompts = [work.system + work.appends[s][0] for s in range(work.sessions)]
        else:
            last = zip(trace.prompts[-1], trace.generated[-1], (a[t] for a in work.appends))
            prompts = [prompt + made + append for prompt, made, append in last]
        arrival, first = time.perf_counter(), {}
        ids = [engine.submit(jnp.asarray(p, jnp.int32), max_new_tokens=work.new) for p in prompts]
        for request_id, _ in engine.stream():
            first.setdefault(request_id, time.perf_counter() - arrival)
        trace.prompts.append(prompts)
        trace.generated.append([engine.finished[i] for i in ids])
        trace.ttft_s.append([first[i] for i in ids])
    trace.seconds = time.perf_counter() - begin
    return trace


def expected_cached(system: int, prompt_lengths: list[list[int]], block: int) -> int:
    """The prompt tokens an unbounded prefix cache serves, from the token counts alone: at turn 0 every session
    after the first continues from the system prompt's whole blocks, and at turn t every session from its turn
    t - 1 prompt's whole blocks (that prompt is its prefix, and the generated tokens are never cached)."""
    whole = lambda n: n // block * block
    first = whole(system) * (len(prompt_lengths[0]) - 1)
    return first + sum(whole(n) for lengths in prompt_lengths[:-1] for n in lengths)


def slot_bytes(engine: Engine) -> int:
    """Bytes of the engine's slot caches (every slot's, allocated for max_len)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(engine.caches))


def measure(kind: str, work: Workload, *, block: int, cache_bytes: int, repeats: int) -> dict:
    """The workload served by a fresh engine `repeats` + 1 times (the first compiles and is dropped): its token
    counts, cache counts and bytes, tokens per second (median seconds) and time to first token (median and p90 over
    every request of the timed runs, and per turn)."""
    model = build(kind)
    max_len = max(len(work.system) + sum(map(len, a)) + work.turns * work.new for a in work.appends)
    traces, engines = [], []

    def one_run():
        engine = Engine(model, slots=work.sessions, max_len=max_len, prefix_cache_bytes=cache_bytes, prefix_block=block)
        traces.append(serve(engine, work))
        engines.append(engine)

    seconds = float(np.median(run_times(one_run, repeats=repeats)))
    trace, engine, timed = traces[-1], engines[-1], traces[1:]
    lengths = [[len(p) for p in prompts] for prompts in trace.prompts]
    prompt_tokens, generated = sum(map(sum, lengths)), sum(len(g) for made in trace.generated for g in made)
    stats = engine.cache_stats()
    ttft = np.array([tr.ttft_s for tr in timed])  # [repeats, turns, sessions]
    held = stats.bytes_held + slot_bytes(engine)
    return {
        "prompt_tokens": prompt_tokens,
        "cached_tokens": stats.tokens_reused,
        "expected_cached_tokens": expected_cached(len(work.system), lengths, block) if cache_bytes else 0,
        "cached_fraction": stats.tokens_reused / prompt_tokens,
        "generated_tokens": generated,
        "seconds": seconds,
        "generated_tokens_per_s": generated / seconds,
        "prompt_tokens_per_s": prompt_tokens / seconds,
        "ttft_s": {"median": float(np.median(ttft)), "p90": float(np.percentile(ttft, 90))},
        "turns": [
            {"turn": t, "prompt_tokens": float(np.mean(lengths[t])), "ttft_median_s": float(np.median(ttft[:, t]))}
            for t in range(work.turns)
        ],
        "prefix_cache": dataclasses.asdict(stats),
        "slot_cache_bytes": slot_bytes(engine),
        "bytes_per_session": held / work.sessions,
    }


def figure(results: dict) -> Figure:
    """Three panels, one color per model (prefix_reuse.py's): bytes held against sessions (solid: the prefix cache,
    dashed: the slots' caches), time to first token per turn against the turn's prompt at the most sessions (solid:
    cache on, dashed: off), and generated tokens per second against sessions (solid: on, dashed: off).

    Args:
        results: agent_serving.json's "results", {model: [a row per session count: {"sessions", "cache_on",
            "cache_off" (None when not run)}]}.

    Returns:
        The figure.
    """
    fig = Figure(figsize=(14, 4))
    bytes_ax, ttft_ax, rate_ax = fig.subplots(1, 3)
    for kind, rows in results.items():
        style = dict(color=COLORS[kind], marker="o")
        sessions = [r["sessions"] for r in rows]
        bytes_ax.plot(sessions, [r["cache_on"]["prefix_cache"]["bytes_held"] / MIB for r in rows], label=kind, **style)
        slots = [r["cache_on"]["slot_cache_bytes"] / MIB for r in rows]
        bytes_ax.plot(sessions, slots, ls="--", label=f"{kind} slots", **style)
        rate_ax.plot(sessions, [r["cache_on"]["generated_tokens_per_s"] for r in rows], label=kind, **style)
        off = [r for r in rows if r["cache_off"]]
        rate = [r["cache_off"]["generated_tokens_per_s"] for r in off]
        rate_ax.plot([r["sessions"] for r in off], rate, ls="--", label=f"{kind} cache off", **style)
        for name, ls in (("cache_on", "-"), ("cache_off", "--")):
            if rows[-1][name]:
                turns = rows[-1][name]["turns"]
                times = [t["ttft_median_s"] * 1e3 for t in turns]
                ttft_ax.plot(
                    [t["prompt_tokens"] for t in turns], times, ls=ls, label=f"{kind} {name.replace('_', ' ')}", **style
                )
    bytes_ax.set(title="bytes held (solid: prefix cache, dashed: slots)", ylabel="bytes held (MiB)", yscale="log")
    ttft_ax.set(title="time to first token per turn, median", ylabel="time to first token (ms)", yscale="log")
    ttft_ax.set_xlabel("the turn's prompt (tokens)")
    rate_ax.set(title="throughput (dashed: cache off)", ylabel="generated tokens/s", yscale="log")
    every = sorted({r["sessions"] for rows in results.values() for r in rows})
    for ax in (bytes_ax, rate_ax):
        ax.set_xlabel("sessions")
        log_ticks(ax, every)
    for ax in (bytes_ax, ttft_ax, rate_ax):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    return fig


def check_args(args: argparse.Namespace) -> None:
    """Refuse flags the workload cannot use, naming the flag (before any work).

    Raises:
        ValueError: a count below its least, or a --history without room for the turns.
    """
    least = {"sessions": 1, "turns": 1, "system": 1, "user": 0, "new": 1, "block": 1, "repeats": 1, "cache_mib": 1}
    for name, low in least.items():
        values = getattr(args, name)
        for value in values if isinstance(values, list) else [values]:
            if value < low:
                raise ValueError(f"--{name.replace('_', '-')}={value}: must be at least {low}")
    tool_tokens(args.history, args.system, args.turns, args.user, args.new)


def session_row(kind: str, sessions: int, args: argparse.Namespace) -> dict:
    """The workload of `sessions` sessions measured for one model with the prefix cache on and (unless
    --no-cache-off) off: a row of the JSON's results, printed too."""
    work = workload(sessions, args.turns, args.history, args.system, args.user, args.new)
    run = lambda cache_bytes: measure(kind, work, block=args.block, cache_bytes=cache_bytes, repeats=args.repeats)
    row = {"sessions": sessions, "cache_on": run(args.cache_mib * MIB)}
    row["cache_off"] = None if args.no_cache_off else run(0)
    print(kind, json.dumps(row))
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", default=[2, 4], help="concurrent sessions, one run each")
    parser.add_argument("--turns", type=int, default=3, help="turns per session")
    parser.add_argument("--history", type=int, default=2048, help="the last turn's prompt (tokens; the issue's: 64k)")
    parser.add_argument("--system", type=int, default=512, help="the shared system prompt (tokens)")
    parser.add_argument("--user", type=int, default=32, help="a user message (tokens); a tool output fills the rest")
    parser.add_argument("--new", type=int, default=16, help="tokens generated per turn")
    parser.add_argument("--block", type=int, default=64, help="the prefix cache's block (prefix_block)")
    parser.add_argument("--cache-mib", type=int, default=8192, help="the prefix cache's budget (MiB)")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per median, after a compiling one")
    parser.add_argument("--no-cache-off", action="store_true", help="skip the run with the prefix cache off")
    args = parse_flags(parser, argv, "results/agent_serving.json")
    out = Path(args.out)
    if args.plot_only:
        return redraw(figure, out)
    check_args(args)
    results = {kind: [session_row(kind, n, args) for n in args.sessions] for kind in args.kinds}
    tool = tool_tokens(args.history, args.system, args.turns, args.user, args.new)
    setup = dict(config=dataclasses.asdict(BASE), kinds={k: KINDS[k] for k in args.kinds})
    setup["parameters"] = {k: sum(x.size for x in jax.tree.leaves(nnx.state(build(k), nnx.Param))) for k in args.kinds}
    setup.update(sessions=args.sessions, turns=args.turns, history=args.history, system=args.system)
    setup.update(tool=tool, user=args.user, new=args.new, block=args.block, cache_mib=args.cache_mib)
    setup.update(repeats=args.repeats, weights="random (nnx.Rngs(0)): serving costs only, not quality")
    out.write_text(json.dumps({"machine": machine(args.note), "setup": setup, "results": results}, indent=1) + "\n")
    save(figure(results), out.with_suffix(".png"))


if __name__ == "__main__":
    main()
