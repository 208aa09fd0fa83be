"""The quality sections of the comparison report (quality.json through experiments/compare/results.py): the protocol,
each task's test metric at every length (mean and range over seeds, at each entry's best learning rate) with its
plot, the learning-rate sweeps, loss by position, training curves and the appendix of every run's command.
"""

from pathlib import Path

from matplotlib.figure import Figure

from experiments.compare.protocol import at_edge
from experiments.compare.results import Results
from experiments.compare.runs import position_losses
from experiments.formatting import md_table, tokens
from experiments.plotting import color, label, log_ticks, save


def lr_text(lr: float | None) -> str:
    return "pending" if lr is None else f"{lr:g}"


def protocol_section(res: Results) -> list[str]:
    """How the numbers were made: per task its cell, tokens, learning rates and seeds; which split selects and
    which reports."""
    rows = []
    for task, t in res.tasks.items():
        cell = f"T={t['seq_len']}"
        if t["num_kv_pairs"]:
            cell += f", {t['num_kv_pairs']} pairs, vocab {t['vocab_size']}, queries >= {t['min_gap']} tokens after"
        seeds = ", ".join(map(str, t["seeds"]))
        lrs = ", ".join(f"{lr:g}" for lr in t["lrs"])
        rows.append([task, cell, f"{t['tokens_per_run']:,}", lrs, seeds, f"{t['matched_window']}"])
    return [
        "## Protocol",
        "",
        "Every entry is trained at each learning rate with the first seed, and reported at its best: the lr with the "
        "best metric on the trainer's eval at the training length (summary.json: eval-split batches 0.., the "
        "*selection* split). Headline entries then train the other seeds at that lr; ablation and frontier entries "
        "report the first seed. Every number in the tables below is the *test* eval: eval-split batches from index "
        "1,000,000 on, draws the selection never saw (for text: other windows of the same held-out documents). "
        "Cells show the mean over seeds and, in brackets, the range; plots draw the range as error bars. Every entry "
        "of a task trains on the same tokens (the same data, batch, length and steps) with the same parameter count "
        "(d_model sized to target_params).",
        "",
        md_table(["task", "cell", "tokens per run", "learning rates", "seeds", "matched window"], rows),
        "",
    ]


def task_section(res: Results, task: str, figdir: Path, rel: str) -> list[str]:
    """The task's table (every entry at every test length) and its plot (headline entries, error bars)."""
    t, metric = res.tasks[task], res.metric(task)
    lengths = res.test_lengths(task) or [t["seq_len"]]
    rows = []
    for entry in t["entries"]:
        summary = res.summary(task, entry)
        params = f"{summary['params']:,}" if summary else "?"
        cells = [res.cell(task, entry, L).text() for L in lengths]
        best = lr_text(res.best_lr(task, entry))
        rows.append([label(entry, res.layer_kinds(task, entry)), params, best, stop_text(res, task, entry), *cells])
    some = next((r["test"][str(lengths[0])] for r in res.quality["runs"] if r["task"] == task and r["test"]), {})
    name = metric.label(some)
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.subplots()
    for entry in (e for e in res.roles["headline"] if e in t["entries"]):
        cells = [(L, res.cell(task, entry, L)) for L in lengths]
        cells = [(L, c) for L, c in cells if c.n]
        if cells:
            xs, mid = [L for L, _ in cells], [c.mean for _, c in cells]
            err = [[c.below for _, c in cells], [c.above for _, c in cells]]
            kinds = res.layer_kinds(task, entry)
            ax.errorbar(xs, mid, yerr=err, fmt="o-", capsize=3, color=color(entry), label=label(entry, kinds))
    if t["num_kv_pairs"]:
        ax.axhline(1 / t["num_kv_pairs"], color="gray", ls="--", lw=1, label=f"1/pairs = 1/{t['num_kv_pairs']}")
        ax.axhline(2 / t["vocab_size"], color="k", ls=":", lw=1, label=f"chance (1 of {t['vocab_size'] // 2} values)")
    ax.set(xlabel="eval length (tokens)", ylabel=name, title=f"{task}: trained at T={t['seq_len']}")
    log_ticks(ax, lengths)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    header = ["model (layers)", "params", "best lr", "steps (converged)", *(f"@{tokens(L)}" for L in lengths)]
    return [
        f"### {task}: test {name} (mean (range) over seeds)",
        "",
        md_table(header, rows),
        "",
        f"![{task}]({rel}/{save(fig, figdir / f'quality_{task}.png')})",
        "",
    ]


def stop_text(res: Results, task: str, entry: str) -> str:
    """Where the entry's best-lr runs stopped (summary.json's stopped_at, steps) and how many of them converged
    under the rule rather than reaching the cap; "-" before they trained or for a run without the rule's keys."""
    summaries = [r["summary"] for r in res.best_runs(task, res.trained(entry)) if r["summary"]]
    runs = [s for s in summaries if "stopped_at" in s]
    if not runs:
        return "-"
    steps = sorted(s["stopped_at"] for s in runs)
    span = f"{steps[0]}" if steps[0] == steps[-1] else f"{steps[0]}-{steps[-1]}"
    return f"{span} ({sum(s['stop_reason'] == 'converged' for s in runs)}/{len(runs)})"


def sweep_cell(value: float | None, best: bool) -> str:
    """One run's selection value, in bold when its lr is the entry's best."""
    return "pending" if value is None else (f"**{value:.3f}**" if best else f"{value:.3f}")


def lr_section(res: Results) -> list[str]:
    """Each entry's selection metric at each learning rate (the best in bold)."""
    out = [
        "## Learning-rate sweeps (selection split, first seed)",
        "",
        "A best lr at the edge of the task's grid extended the entry's grid one step beyond it (columns outside the "
        "task's grid; `-`: not run for that entry); `edge` flags a best still at its grid's edge, where the optimum "
        "may lie further out.",
        "",
    ]
    for task, t in res.tasks.items():
        trained = [e for e in t["entries"] if res.entries[e]["kv_cache_bits"] is None]
        columns = sorted({lr for e in trained for lr in res.lrs(task, e)} | set(t["lrs"]))
        rows = []
        for entry in trained:
            best, values = res.best_lr(task, entry), res.sweep(task, entry)
            cells = [sweep_cell(values[lr], lr == best) if lr in values else "-" for lr in columns]
            rows.append([entry, *cells, "edge" if at_edge(tuple(res.lrs(task, entry)), best) else ""])
        out += [f"{task}:", "", md_table(["entry", *(f"lr {lr:g}" for lr in columns), "best"], rows), ""]
    return out


def position_section(res: Results, figdir: Path, rel: str) -> list[str]:
    """Loss by position at each eval length (the trainer's eval of the best first-seed runs), where the runs'
    summary.json has it (the text task, once the data issue adds the buckets)."""
    out = []
    for task, t in res.tasks.items():
        curves = {}
        for entry in (e for e in res.roles["headline"] if e in t["entries"]):
            runs = [r for r in res.best_runs(task, entry) if r["summary"]]
            if runs:
                evals = runs[0]["summary"]["eval"]
                longest = max(evals, key=int)
                if buckets := position_losses(evals[longest]):
                    curves[entry] = (int(longest), buckets)
        if not curves:
            continue
        fig = Figure(figsize=(6.5, 4.2))
        ax = fig.subplots()
        for entry, (L, buckets) in curves.items():
            name = label(entry, res.layer_kinds(task, entry)) + f" at {tokens(L)}"
            ax.plot([p + 1 for p in buckets], list(buckets.values()), "o-", color=color(entry), label=name)
        ax.axvline(t["seq_len"], color="gray", ls="--", lw=1, label=f"training length {t['seq_len']}")
        ax.set(xscale="log", xlabel="position (tokens, bucket start + 1)", ylabel="mean loss in the bucket")
        ax.set_title(f"{task}: loss by position (selection split, first seed)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        out += [f"### {task}: loss by position", "", f"![position]({rel}/{save(fig, figdir / f'position_{task}.png')})"]
        out += [""]
    return out


def curves_section(res: Results, figdir: Path, rel: str) -> list[str]:
    """The best first-seed run of each headline entry: its held-out metric against tokens (the trainer's evals,
    `summary.eval_curve`), and its training loss against tokens and against wall time (`train_curve`, read from
    TensorBoard when collected); the tasks whose runs kept no training-loss curve are named."""
    tasks = list(res.tasks)
    fig = Figure(figsize=(5 * len(tasks), 11))
    axes = fig.subplots(3, len(tasks), squeeze=False)
    missing = []
    for col, task in enumerate(tasks):
        tokens_per_step = res.tasks[task]["tokens_per_run"] / max(1, _steps(res, task))
        drawn, metric = 0, "metric"
        for entry in (e for e in res.roles["headline"] if e in res.tasks[task]["entries"]):
            runs = [r for r in res.best_runs(task, entry) if r["summary"]]
            if not runs:
                continue
            name, summary = label(entry, res.layer_kinds(task, entry)), runs[0]["summary"]
            if summary.get("eval_curve"):
                steps, values = zip(*summary["eval_curve"])
                metric = summary.get("rule", {}).get("metric", metric)
                x = [s * tokens_per_step for s in steps]  # markers: a run with one eval is a dot
                axes[0][col].plot(x, values, color=color(entry), marker="o", markersize=3, label=name)
            if runs[0].get("train_curve"):
                steps, wall, loss = zip(*runs[0]["train_curve"])
                axes[1][col].plot([s * tokens_per_step for s in steps], loss, color=color(entry))
                axes[2][col].plot(wall, loss, color=color(entry))
                drawn += 1
        axes[0][col].set(title=f"{task}: held-out {metric} vs tokens", xlabel="tokens", ylabel=f"held-out {metric}")
        axes[0][col].legend(fontsize=7)
        axes[1][col].set(title=f"{task}: train loss vs tokens", xlabel="tokens", ylabel="loss (nats per token)")
        wall = "seconds since the run started (with compilation)"
        axes[2][col].set(title=f"{task}: train loss vs wall time", xlabel=wall, ylabel="loss (nats per token)")
        if not drawn:
            missing.append(task)
            axes[1][col].text(0.5, 0.5, "no training-loss curve kept", ha="center", transform=axes[1][col].transAxes)
    note = []
    if missing:
        note = [
            f"No training-loss curve for {', '.join(missing)}: those runs were collected before quality.json kept"
            " curves and their folders are not on this machine (their held-out curves, top row, are drawn).",
            "",
        ]
    return [
        "## Training curves",
        "",
        f"TensorBoard for all runs: `tensorboard --logdir {res.quality.get('runs_dir', '')}`.",
        "",
        *note,
        f"![curves]({rel}/{save(fig, figdir / 'curves.png')})",
        "",
    ]


def _steps(res: Results, task: str) -> int:
    summary = next((r["summary"] for r in res.quality["runs"] if r["task"] == task and r["summary"]), None)
    return summary["steps"] if summary else 1


def runs_appendix(res: Results) -> list[str]:
    """Every run: its folder (config.yaml, compare.json, summary.json, test.json beside the trainer's files), its
    state, wall time and the exact command that repeats it."""
    rows = []
    for r in res.quality["runs"]:
        record = r["record"] or {}
        state = "test done" if r["test"] else ("trained" if r["summary"] else "pending")
        wall = f"{record['wall_s']:.0f} s" if "wall_s" in record else "-"
        command = record.get("command") or (f"evaluates {record['evaluates']}" if "evaluates" in record else "-")
        rows.append([r["task"], r["entry"], f"{r['lr']:g}", str(r["seed"]), state, wall, f"`{command}`"])
    return [
        "## Appendix: every run",
        "",
        "Each run folder holds config.yaml (the resolved config) and compare.json (its overrides); the command "
        "repeats the run with train.py.",
        "",
        md_table(["task", "entry", "lr", "seed", "state", "train wall", "command"], rows),
        "",
    ]
