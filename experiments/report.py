"""The comparison report: reads a comparison's speed.json and quality.json (python -m experiments.compare.run) and
its runs' TensorBoard logs, and writes a Markdown report with tables and PNG plots (step time vs T, decode time vs
context, cache bytes vs context, accuracy vs context, loss vs tokens and vs wall time).

    python -m experiments.report results/compare/cpu --out results/REPORT.md

Every model is named with its layers' mixers (`hybrid (PPPA)`; a task's 2-layer hybrid is `hybrid (PA)`). A
hand-written reading of the results, if <data>/NOTES.md exists, is placed after the headline numbers.
"""

import argparse
import json
import os
from pathlib import Path

import matplotlib.ticker
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from experiments.formatting import human_bytes, tokens

MIB = 2**20
COLORS = {"softmax": "C0", "swa": "C1", "swa_matched": "C4", "power": "C2", "hybrid": "C3"}
QUALITY_METRIC = {
    "mqar": ("accuracy", "accuracy"),
    "passkey": ("exact_match", "exact match"),
    "text": ("loss", "loss (nats/byte)"),
}


def label(model: str, layer_kinds: str) -> str:
    """The model's name and its layers' mixers, e.g. "hybrid (PPPA)"."""
    return f"{model} ({layer_kinds})"


def log_ticks(ax, lengths: list[int]) -> None:
    """Log x axis with a tick at each length, labelled 256, 1k, 64k..."""
    ax.set_xscale("log")
    ax.set_xticks(lengths, [tokens(L) for L in lengths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; every column after the first right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def times(ratio: float) -> str:
    """A ratio as 0.52x, 6.7x or 94x."""
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def save(fig: Figure, path: Path) -> str:
    """Write the figure as a PNG at `path`; returns its file name."""
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path.name


def first(seeds: dict) -> dict:
    """The summary of a model's first seed (the seeds of one model share its size and layers)."""
    return next(iter(seeds.values()))


def speed_section(speed: dict, figdir: Path, rel: str) -> list[str]:
    """Tables and plots of train-step time, decode time and cache bytes."""
    res = speed["results"]
    models = list(res)
    name = {m: label(m, res[m]["layer_kinds"]) for m in models}
    lengths = [r["T"] for r in res[models[0]]["train"]]
    step = {m: {r["T"]: r for r in res[m]["train"]} for m in models}
    n_tokens = res[models[0]]["train"][0]["batch"] * lengths[0]
    header = ["model", *(f"T={tokens(T)}" for T in lengths)]
    out = [
        "## Speed and memory",
        "",
        f"Training step (forward, backward, AdamW) at {n_tokens:,} tokens per step, median seconds; in brackets, "
        "softmax's time over this model's (above 1: faster than softmax).",
        "",
    ]
    step_s = lambda m, T: step[m][T]["step_s"]
    cell = lambda m, T: f"{step_s(m, T):.3g} s ({times(step_s('softmax', T) / step_s(m, T))})"
    rows = [[name[m], *(cell(m, T) for T in lengths)] for m in models]
    out += [md_table(header, rows), ""]
    rate = lambda r: f"{r['tokens_per_s']:,.0f} / {100 * r['peak_fraction']:.0f}% / {human_bytes(r['temp_bytes'])}"
    rows = [[name[m], *(rate(step[m][T]) for T in lengths)] for m in models]
    out += [
        "Tokens/s, achieved FLOP/s as a share of the matmul rate, and XLA's temporary bytes of the compiled step:",
        "",
        md_table(header, rows),
        "",
    ]
    contexts = list(res[models[0]]["decode"])
    ms = {m: {c: res[m]["decode"][c]["ms_per_token"] for c in contexts} for m in models}
    rows = [[name[m], *(f"{ms[m][c]:.3g} ms ({times(ms['softmax'][c] / ms[m][c])})" for c in contexts)] for m in models]
    out += [
        "Greedy decode, batch 1, ms per token after a prompt of each length (softmax's time over this model's):",
        "",
        md_table(["model", *(f"ctx={tokens(int(c))}" for c in contexts)], rows),
        "",
    ]
    cache_ctx = list(res[models[0]]["cache_bytes"])
    rows = [[name[m], *(human_bytes(res[m]["cache_bytes"][c]) for c in cache_ctx)] for m in models]
    header = ["model", *(tokens(int(c)) for c in cache_ctx)]
    out += ["Decode-cache bytes per sequence:", "", md_table(header, rows), ""]

    fig = Figure(figsize=(15, 4.2))
    axes = fig.subplots(1, 3)
    for m in models:
        color = COLORS.get(m)
        axes[0].plot(lengths, [step_s(m, T) for T in lengths], "o-", color=color, label=name[m])
        axes[1].plot([int(c) for c in contexts], [ms[m][c] for c in contexts], "o-", color=color)
        cache_mib = [res[m]["cache_bytes"][c] / MIB for c in cache_ctx]
        axes[2].plot([int(c) for c in cache_ctx], cache_mib, "o-", color=color)
    axes[0].set(title="train step time vs T (same tokens per step)", ylabel="seconds")
    axes[1].set(title="decode time vs context", ylabel="ms per token")
    axes[2].set(title="decode cache vs context", ylabel="MiB per sequence")
    for ax, xs in zip(axes, (lengths, [int(c) for c in contexts], [int(c) for c in cache_ctx])):
        ax.set(yscale="log", xlabel="tokens")
        log_ticks(ax, xs)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend()
    out += [f"![speed]({rel}/{save(fig, figdir / 'speed.png')})", ""]
    return out


def op_section(op: dict) -> list[str]:
    """The op-level table of experiments/op_speed.py (forward+backward, power c=128 against softmax)."""
    train = {(r["name"], r["T"]): r for r in op["rows"] if r["kind"] == "train"}
    lengths = sorted({T for _, T in train})
    cfg, rate = op["config"], op["matmul_gflops"]
    rows = []
    for T in lengths:
        p, s = train.get(("power c=128", T)), train.get(("softmax blockwise", T))
        if p and s:
            speedup, share = times(s["fwd_bwd_s"] / p["fwd_bwd_s"]), f"{100 * p['gflops_fwd_bwd'] / rate:.0f}%"
            rows.append([tokens(T), f"{p['fwd_bwd_s']:.3g} s", f"{s['fwd_bwd_s']:.3g} s", speedup, share])
    decode = [
        [
            tokens(r["T"]),
            f"{r['power_ms_per_token']:.3g} ms",
            f"{r['kv_ms_per_token']:.3g} ms",
            times(r["speedup"]),
            times(r["byte_ratio"]),
        ]
        for r in op["rows"]
        if r["kind"] == "decode"
    ]
    return [
        "## The op alone (experiments/op_speed.py)",
        "",
        f"One layer's mixer, B={cfg['batch']}, H={cfg['heads']}, d={cfg['head_dim']}, float32, forward+backward; "
        f"matmul rate {rate:.0f} GFLOP/s on {op['machine']['backend']} ({op['machine'].get('cpus', '?')} cores).",
        "",
        md_table(["T", "power c=128", "softmax", "speed-up", "power % of matmul rate"], rows),
        "",
        "Decode per token against a KV cache of the context (state read and write vs cache read):",
        "",
        md_table(["context", "power", "KV cache", "speed-up", "KV bytes / state bytes"], decode),
        "",
    ]


def quality_section(quality: dict, figdir: Path, rel: str) -> list[str]:
    """Per-task tables (mean over seeds, with the range) and the accuracy-vs-context plot."""
    res = quality["results"]
    out = ["## Quality", ""]
    fig = Figure(figsize=(5 * len(res), 4))
    axes = fig.subplots(1, len(res), squeeze=False)
    for ax, (task, models) in zip(axes[0], res.items()):
        key, metric = QUALITY_METRIC.get(task, ("loss", "loss"))
        lengths = sorted(int(L) for L in first(next(iter(models.values())))["eval"])
        rows = []
        for m, seeds in models.items():
            name = label(m, first(seeds)["layer_kinds"])
            cells, means = [], []
            for L in lengths:
                vals = [s["eval"][str(L)][key] for s in seeds.values()]
                means.append(sum(vals) / len(vals))
                cells.append(f"{means[-1]:.3f}" + (f" ({min(vals):.3f}-{max(vals):.3f})" if len(vals) > 1 else ""))
            wall = sum(s.get("wall_s", 0) for s in seeds.values()) / len(seeds)
            rows.append([name, f"{first(seeds)['params']:,}", *cells, f"{wall:.0f} s"])
            ax.plot(lengths, means, "o-", color=COLORS.get(m), label=name)
        ax.set(xlabel="eval length (tokens)", ylabel=metric, title=f"{task} (trained at T={lengths[0]})")
        log_ticks(ax, lengths)
        ax.grid(alpha=0.3)
        n_seeds = len(next(iter(models.values())))
        out += [
            f"### {task}: {metric} at 1x, 4x, 16x the training length (mean of {n_seeds} seed(s))",
            "",
            md_table(["model", "params", *(tokens(L) for L in lengths), "train wall"], rows),
            "",
        ]
    axes[0][0].legend()
    out += [f"![quality]({rel}/{save(fig, figdir / 'quality.png')})", ""]
    return out


def curves_section(quality: dict, figdir: Path, rel: str) -> list[str]:
    """Training loss against tokens and against wall time, read from each run's TensorBoard events (seed 0)."""
    runs = Path(quality.get("runs", ""))
    res = quality["results"]
    if not runs.is_dir():
        return ["## Training curves", "", f"TensorBoard logs not found under `{runs}`: curves left out.", ""]
    fig = Figure(figsize=(5 * len(res), 7.5))
    axes = fig.subplots(2, len(res), squeeze=False)
    for col, (task, models) in enumerate(res.items()):
        for m, seeds in models.items():
            seed, summary = next(iter(seeds.items()))
            acc = EventAccumulator(str(runs / task / m / f"seed{seed}" / "tb"), size_guidance={"scalars": 0})
            acc.Reload()
            loss = acc.Scalars("train/loss")
            start = min(e.wall_time for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag))
            n_tokens, color = summary["tokens_per_step"], COLORS.get(m)
            axes[0][col].plot(
                [e.step * n_tokens for e in loss],
                [e.value for e in loss],
                color=color,
                label=label(m, summary["layer_kinds"]),
            )
            axes[1][col].plot([e.wall_time - start for e in loss], [e.value for e in loss], color=color)
        axes[0][col].set(title=f"{task}: train loss vs tokens", xlabel="tokens", ylabel="loss")
        wall = "seconds since the run started (with compilation)"
        axes[1][col].set(title=f"{task}: train loss vs wall time", xlabel=wall, ylabel="loss")
    axes[0][0].legend()
    return [
        "## Training curves",
        "",
        f"TensorBoard for all runs: `tensorboard --logdir {runs}`.",
        "",
        f"![curves]({rel}/{save(fig, figdir / 'curves.png')})",
        "",
    ]


def mean_metric(seeds: dict, task: str, length: str) -> float:
    """The task's metric at `length`, averaged over the seeds' summaries."""
    key = QUALITY_METRIC.get(task, ("loss",))[0]
    return sum(s["eval"][length][key] for s in seeds.values()) / len(seeds)


def headline_section(speed: dict | None, quality: dict | None) -> list[str]:
    """One row per model: what it buys (speed at the longest T and context, cache bytes there) and what it
    costs (each task's metric at 1x and at the longest eval length). Models are named with the speed runs'
    layers (else the first task's); a task whose models have other layers says so."""
    tasks = quality["results"] if quality else {}
    if speed:
        kinds = {m: r["layer_kinds"] for m, r in speed["results"].items()}
    else:
        kinds = {m: first(seeds)["layer_kinds"] for m, seeds in next(iter(tasks.values())).items()}
    models = list(kinds)
    header, cells = ["model"], {m: [label(m, kinds[m])] for m in models}
    if speed:
        res = speed["results"]
        T = max(r["T"] for r in res["softmax"]["train"])
        ctx = max(res["softmax"]["decode"], key=int)
        step = {m: next(r["step_s"] for r in res[m]["train"] if r["T"] == T) for m in models}
        header += [f"train-step speed-up at {tokens(T)}", f"decode speed-up at {tokens(int(ctx))}"]
        header += [f"cache at {tokens(int(ctx))}"]
        for m in models:
            decode = times(res["softmax"]["decode"][ctx]["ms_per_token"] / res[m]["decode"][ctx]["ms_per_token"])
            cells[m] += [times(step["softmax"] / step[m]), decode, human_bytes(res[m]["cache_bytes"][ctx])]
    for task, per_model in tasks.items():
        lengths = sorted(first(next(iter(per_model.values())))["eval"], key=int)
        metric = QUALITY_METRIC.get(task, ("loss", "loss"))[1]
        header += [f"{task} {metric} @{tokens(int(lengths[0]))} / @{tokens(int(lengths[-1]))}"]
        for m in models:
            short, long = (mean_metric(per_model[m], task, L) for L in (lengths[0], lengths[-1]))
            cells[m].append(f"{short:.3f} / {long:.3f}")
    other = {
        task: ", ".join(f"{m} {first(seeds)['layer_kinds']}" for m, seeds in per_model.items())
        for task, per_model in tasks.items()
        if any(first(seeds)["layer_kinds"] != kinds[m] for m, seeds in per_model.items())
    }
    return [
        "## Headline",
        "",
        "Speed-ups are softmax's time over the model's (below 1: slower than softmax); the task columns give the "
        "metric at the training length and at the longest eval length (16x)."
        + (f" Some tasks train other layers ({'; '.join(f'{t}: {ls}' for t, ls in other.items())})." if other else ""),
        "",
        md_table(header, [cells[m] for m in models]),
        "",
    ]


def write_report(data: Path, out: Path, op_speed: Path | None = Path("results/op_speed.json")) -> None:
    """Write the report of the comparison in `data` to `out`, its PNGs into `data`."""
    speed = json.loads((data / "speed.json").read_text()) if (data / "speed.json").exists() else None
    quality = json.loads((data / "quality.json").read_text()) if (data / "quality.json").exists() else None
    meta = speed or quality
    if meta is None:
        raise SystemExit(f"neither speed.json nor quality.json in {data}: run python -m experiments.compare.run first")
    mach = meta["machine"]
    rel = os.path.relpath(data, out.parent)
    lines = [
        f"# Power retention against softmax: the `{meta['preset']}` comparison",
        "",
        f"Machine: {mach['device']} ({mach['backend']}, {mach['devices']} device(s), {mach['cpus']} CPU cores), "
        f"JAX {mach['jax']}; {mach['date']}. Made by `{meta['command']}`; the sliding window matched to the "
        f"power state's bytes is {meta['matched_window']} tokens.",
        "",
    ]
    lines += headline_section(speed, quality)
    if (data / "NOTES.md").exists():
        lines += [(data / "NOTES.md").read_text(), ""]
    if speed:
        lines += speed_section(speed, data, rel)
    if op_speed is not None and op_speed.exists():
        lines += op_section(json.loads(op_speed.read_text()))
    if quality:
        lines += quality_section(quality, data, rel) + curves_section(quality, data, rel)
    out.write_text("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="a comparison folder with speed.json and/or quality.json")
    parser.add_argument("--out", type=Path, help="the Markdown report (default <data>/REPORT.md)")
    args = parser.parse_args()
    out = args.out or args.data / "REPORT.md"
    write_report(args.data, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
