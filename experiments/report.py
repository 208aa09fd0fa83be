"""The comparison report: reads a comparison's speed.json and quality.json (experiments/compare/run.py) and its
runs' TensorBoard logs, and writes a Markdown report with tables and PNG plots (step time vs T, decode time vs
context, cache bytes vs context, accuracy vs context, loss vs tokens and vs wall time).

    python experiments/report.py results/compare/cpu --out results/REPORT.md

A hand-written reading of the results, if <data>/NOTES.md exists, is placed after the headline numbers.
"""

import argparse
import json
import os
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

MIB = 2**20
STYLE = {"softmax": ("A", "C0"), "swa": ("W", "C1"), "swa_matched": ("W, state bytes", "C4"), "power": ("P", "C2"),
         "hybrid": ("PPPA", "C3")}  # fmt: skip
QUALITY_METRIC = {"mqar": ("accuracy", "accuracy"), "passkey": ("exact_match", "exact match"),
                  "text": ("loss", "loss (nats/byte)")}  # fmt: skip


def label(model: str, pattern: str | None = None) -> str:
    """The model's name and its layer pattern (the run's own where given, e.g. a task's 2-layer hybrid "PA")."""
    return f"{model} ({pattern or STYLE.get(model, (model,))[0]})"


def log_ticks(ax, lengths: list[int]) -> None:
    """Log x axis with a tick at each length, labelled 256, 1k, 64k..."""
    ax.set_xscale("log")
    ax.set_xticks(lengths, [ktok(L) for L in lengths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; every column after the first right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def kib(n: float) -> str:
    return f"{n / 1024:,.0f} KiB" if n < MIB else f"{n / MIB:,.1f} MiB"


def times(ratio: float) -> str:
    """A ratio as 0.52x, 6.7x or 94x."""
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def ktok(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 else str(n)


def save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def speed_section(speed: dict, figdir: Path, rel: str) -> list[str]:
    """Tables and plots of train-step time, decode time and cache bytes."""
    res = speed["results"]
    models = list(res)
    lengths = [r["T"] for r in res[models[0]]["train"]]
    step = {m: {r["T"]: r for r in res[m]["train"]} for m in models}
    tokens = res[models[0]]["train"][0]["batch"] * lengths[0]
    out = ["## Speed and memory", "",
           f"Training step (forward, backward, AdamW) at {tokens:,} tokens per step, median seconds; in brackets, "
           "softmax's time over this model's (above 1: faster than softmax).", ""]  # fmt: skip
    rows = [[label(m), *(f"{step[m][T]['step_s']:.3g} s ({times(step['softmax'][T]['step_s'] / step[m][T]['step_s'])})"
                         for T in lengths)] for m in models]  # fmt: skip
    out += [md_table(["model", *(f"T={ktok(T)}" for T in lengths)], rows), ""]
    rows = [[label(m), *(f"{step[m][T]['tokens_per_s']:,.0f} / {100 * step[m][T]['peak_fraction']:.0f}% / "
                         f"{kib(step[m][T]['temp_bytes'])}" for T in lengths)] for m in models]  # fmt: skip
    out += ["Tokens/s, achieved FLOP/s as a share of the matmul rate, and XLA's temporary bytes of the compiled step:",
            "", md_table(["model", *(f"T={ktok(T)}" for T in lengths)], rows), ""]  # fmt: skip
    contexts = list(res[models[0]]["decode"])
    dec = {m: res[m]["decode"] for m in models}
    ms = {m: {c: dec[m][c]["ms_per_token"] for c in contexts} for m in models}
    rows = [[label(m), *(f"{ms[m][c]:.3g} ms ({times(ms['softmax'][c] / ms[m][c])})" for c in contexts)]
            for m in models]  # fmt: skip
    out += ["Greedy decode, batch 1, ms per token after a prompt of each length (softmax's time over this model's):",
            "", md_table(["model", *(f"ctx={ktok(int(c))}" for c in contexts)], rows), ""]  # fmt: skip
    cache_ctx = list(res[models[0]]["cache_bytes"])
    rows = [[label(m), *(kib(res[m]["cache_bytes"][c]) for c in cache_ctx)] for m in models]
    out += ["Decode-cache bytes per sequence:", "", md_table(["model", *(ktok(int(c)) for c in cache_ctx)], rows), ""]

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for m in models:
        _, color = STYLE.get(m, (m, None))
        axes[0].plot(lengths, [step[m][T]["step_s"] for T in lengths], "o-", color=color, label=label(m))
        axes[1].plot([int(c) for c in contexts], [dec[m][c]["ms_per_token"] for c in contexts], "o-", color=color)
        axes[2].plot([int(c) for c in cache_ctx], [res[m]["cache_bytes"][c] / MIB for c in cache_ctx], "o-",
                     color=color)  # fmt: skip
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
    cfg = op["config"]
    rows = []
    for T in lengths:
        p, s = train.get(("power c=128", T)), train.get(("softmax blockwise", T))
        if p and s:
            rows.append([ktok(T), f"{p['fwd_bwd_s']:.3g} s", f"{s['fwd_bwd_s']:.3g} s",
                         times(s["fwd_bwd_s"] / p["fwd_bwd_s"]),
                         f"{100 * p['gflops_fwd_bwd'] / op['matmul_gflops']:.0f}%"])  # fmt: skip
    decode = [[ktok(r["T"]), f"{r['power_ms_per_token']:.3g} ms", f"{r['kv_ms_per_token']:.3g} ms",
               times(r["speedup"]), times(r["byte_ratio"])]
              for r in op["rows"] if r["kind"] == "decode"]  # fmt: skip
    return ["## The op alone (experiments/op_speed.py)", "",
            f"One layer's mixer, B={cfg['batch']}, H={cfg['heads']}, d={cfg['head_dim']}, float32, forward+backward; "
            f"matmul rate {op['matmul_gflops']:.0f} GFLOP/s on {op['machine']['backend']} "
            f"({op['machine'].get('cpus', '?')} cores).", "",
            md_table(["T", "power c=128", "softmax", "speed-up", "power % of matmul rate"], rows), "",
            "Decode per token against a KV cache of the context (state read and write vs cache read):", "",
            md_table(["context", "power", "KV cache", "speed-up", "KV bytes / state bytes"], decode), ""]  # fmt: skip


def quality_section(quality: dict, figdir: Path, rel: str) -> list[str]:
    """Per-task tables (mean over seeds, with the range) and the accuracy-vs-context plot."""
    res = quality["results"]
    out = ["## Quality", ""]
    fig, axes = plt.subplots(1, len(res), figsize=(5 * len(res), 4), squeeze=False)
    for ax, (task, models) in zip(axes[0], res.items()):
        key, name = QUALITY_METRIC.get(task, ("loss", "loss"))
        first = next(iter(next(iter(models.values())).values()))
        lengths = sorted(int(L) for L in first["eval"])
        rows = []
        for m, seeds in models.items():
            cells = []
            for L in lengths:
                vals = [s["eval"][str(L)][key] for s in seeds.values()]
                mean = sum(vals) / len(vals)
                cells.append(f"{mean:.3f}" + (f" ({min(vals):.3f}-{max(vals):.3f})" if len(vals) > 1 else ""))
            wall = sum(s.get("wall_s", 0) for s in seeds.values()) / len(seeds)
            rows.append([label(m, pattern_of(seeds)), f"{first_params(seeds):,}", *cells, f"{wall:.0f} s"])
            _, color = STYLE.get(m, (m, None))
            ax.plot(lengths, [sum(s["eval"][str(L)][key] for s in seeds.values()) / len(seeds) for L in lengths],
                    "o-", color=color, label=label(m, pattern_of(seeds)))  # fmt: skip
        ax.set(xlabel="eval length (tokens)", ylabel=name, title=f"{task} (trained at T={lengths[0]})")
        log_ticks(ax, lengths)
        ax.grid(alpha=0.3)
        n_seeds = len(next(iter(models.values())))
        out += [f"### {task}: {name} at 1x, 4x, 16x the training length (mean of {n_seeds} seed(s))", "",
                md_table(["model", "params", *(f"{ktok(L)}" for L in lengths), "train wall"], rows), ""]  # fmt: skip
    axes[0][0].legend()
    out += [f"![quality]({rel}/{save(fig, figdir / 'quality.png')})", ""]
    return out


def first_params(seeds: dict) -> int:
    return next(iter(seeds.values()))["params"]


def pattern_of(seeds: dict) -> str | None:
    return next(iter(seeds.values())).get("pattern")


def curves_section(quality: dict, figdir: Path, rel: str) -> list[str]:
    """Training loss against tokens and against wall time, read from each run's TensorBoard events (seed 0)."""
    runs = Path(quality.get("runs", ""))
    res = quality["results"]
    if not runs.is_dir():
        return ["## Training curves", "", f"TensorBoard logs not found under `{runs}`: curves left out.", ""]
    fig, axes = plt.subplots(2, len(res), figsize=(5 * len(res), 7.5), squeeze=False)
    for col, (task, models) in enumerate(res.items()):
        for m, seeds in models.items():
            seed, summary = next(iter(seeds.items()))
            tb = runs / task / m / f"seed{seed}" / "tb"
            acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
            acc.Reload()
            loss = acc.Scalars("train/loss")
            start = min(e.wall_time for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag))
            tokens = summary["tokens_per_step"]
            _, color = STYLE.get(m, (m, None))
            axes[0][col].plot([e.step * tokens for e in loss], [e.value for e in loss], color=color,
                              label=label(m, summary.get("pattern")))  # fmt: skip
            axes[1][col].plot([e.wall_time - start for e in loss], [e.value for e in loss], color=color)
        axes[0][col].set(title=f"{task}: train loss vs tokens", xlabel="tokens", ylabel="loss")
        axes[1][col].set(title=f"{task}: train loss vs wall time",
                         xlabel="seconds since the run started (with compilation)",
                              ylabel="loss")  # fmt: skip
    axes[0][0].legend()
    return ["## Training curves", "", f"TensorBoard for all runs: `tensorboard --logdir {runs}`.", "",
            f"![curves]({rel}/{save(fig, figdir / 'curves.png')})", ""]  # fmt: skip


def mean_metric(seeds: dict, task: str, length: str) -> float:
    """The task's metric at `length`, averaged over the seeds' summaries."""
    key = QUALITY_METRIC.get(task, ("loss",))[0]
    return sum(s["eval"][length][key] for s in seeds.values()) / len(seeds)


def headline_section(speed: dict | None, quality: dict | None) -> list[str]:
    """One row per model: what it buys (speed at the longest T and context, cache bytes there) and what it
    costs (each task's metric at 1x and at the longest eval length)."""
    models = list((speed or quality)["results"] if speed else next(iter(quality["results"].values())))
    header, cells = ["model"], {m: [label(m)] for m in models}
    if speed:
        res = speed["results"]
        T = max(r["T"] for r in res["softmax"]["train"])
        ctx = max(res["softmax"]["decode"], key=int)
        step = {m: next(r["step_s"] for r in res[m]["train"] if r["T"] == T) for m in models}
        header += [f"train-step speed-up at {ktok(T)}", f"decode speed-up at {ktok(int(ctx))}",
                   f"cache at {ktok(int(ctx))}"]
        for m in models:
            dec = res[m]["decode"][ctx]
            cells[m] += [times(step["softmax"] / step[m]),
                         times(res["softmax"]["decode"][ctx]["ms_per_token"] / dec["ms_per_token"]),
                         kib(res[m]["cache_bytes"][ctx])]  # fmt: skip
    for task, per_model in (quality or {"results": {}})["results"].items():
        lengths = sorted(next(iter(next(iter(per_model.values())).values()))["eval"], key=int)
        name = QUALITY_METRIC.get(task, ("loss", "loss"))[1]
        header += [f"{task} {name} @{ktok(int(lengths[0]))} / @{ktok(int(lengths[-1]))}"]
        for m in models:
            seeds = per_model[m]
            cells[m].append(f"{mean_metric(seeds, task, lengths[0]):.3f} / {mean_metric(seeds, task, lengths[-1]):.3f}")
    default = lambda m: STYLE.get(m, (m,))[0].split(",")[0]  # "W, state bytes" -> "W"
    tasks = (quality or {"results": {}})["results"]
    other = [f"{m} is {pattern_of(seeds)} in {task}" for task, per_model in tasks.items()
             for m, seeds in per_model.items() if pattern_of(seeds) not in (None, default(m))]  # fmt: skip
    return ["## Headline", "", "Speed-ups are softmax's time over the model's (below 1: slower than softmax); the task "
            "columns give the metric at the training length and at the longest eval length (16x)."
            + (f" Layer patterns differ for some tasks: {'; '.join(other)}." if other else ""), "",
            md_table(header, [cells[m] for m in models]), ""]  # fmt: skip


def write_report(data: Path, out: Path, op_speed: Path | None = Path("results/op_speed.json")) -> None:
    """Write the report of the comparison in `data` to `out`, its PNGs into `data`."""
    speed = json.loads((data / "speed.json").read_text()) if (data / "speed.json").exists() else None
    quality = json.loads((data / "quality.json").read_text()) if (data / "quality.json").exists() else None
    meta = speed or quality
    if meta is None:
        raise SystemExit(f"neither speed.json nor quality.json in {data}: run experiments/compare/run.py first")
    mach = meta["machine"]
    rel = os.path.relpath(data, out.parent)
    lines = [f"# Power retention against softmax: the `{meta['preset']}` comparison", "",
             f"Machine: {mach['device']} ({mach['backend']}, {mach['devices']} device(s), {mach['cpus']} CPU cores), "
             f"JAX {mach['jax']}; {mach['date']}. Made by `{meta['command']}`; the sliding window matched to the "
             f"power state's bytes is {meta['matched_window']} tokens.", ""]  # fmt: skip
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
