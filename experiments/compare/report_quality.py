"""The quality sections of the comparison report (quality.json through experiments/compare/results.py): the protocol,
each task's test metric at every length (mean and range over seeds, at each entry's best learning rate) with its
plot, the learning-rate sweeps, loss by position, training curves and the appendix of every run's command. A task
whose runs were evaluated once (a smoke test) gets its table and no plot.
"""

from pathlib import Path

from matplotlib.figure import Figure

from experiments.compare.protocol import at_edge
from experiments.compare.results import Results
from experiments.compare.runs import position_losses
from experiments.formatting import md_table, tokens
from experiments.plotting import label, line_style, log_ticks, save


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
        rows.append([label(entry, res.layers(task, entry)), params, best, stop_text(res, task, entry), *cells])
    some = next((r["test"][str(lengths[0])] for r in res.quality["runs"] if r["task"] == task and r["test"]), {})
    name = metric.label(some)
    header = ["model (layers)", "params", "best lr", "steps (converged)", *(f"@{tokens(L)}" for L in lengths)]
    if res.evaluated_once(task):
        figure = (
            f"No plots of {task} (here, by position or in the training curves): each of its runs was evaluated once, "
            "a smoke test's budget that shows no learning; the table holds its numbers."
        )
    else:
        figure = f"![{task}]({rel}/{save(task_figure(res, task, lengths, name), figdir / f'quality_{task}.png')})"
    return [f"### {task}: test {name} (mean (range) over seeds)", "", md_table(header, rows), "", figure, ""]


def task_figure(res: Results, task: str, lengths: list[int], name: str) -> Figure:
    """The headline entries' test metric (`name`) against eval length, error bars over seeds; MQAR's 1/pairs and
    chance levels."""
    t = res.tasks[task]
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.subplots()
    for entry in (e for e in res.roles["headline"] if e in t["entries"]):
        cells = [(L, res.cell(task, entry, L)) for L in lengths]
        cells = [(L, c) for L, c in cells if c.n]
        if cells:
            xs, mid = [L for L, _ in cells], [c.mean for _, c in cells]
            err = [[c.below for _, c in cells], [c.above for _, c in cells]]
            model = label(entry, res.layers(task, entry))
            ax.errorbar(xs, mid, yerr=err, fmt="o", capsize=3, **line_style(entry), label=model)
    if t["num_kv_pairs"]:
        ax.axhline(1 / t["num_kv_pairs"], color="gray", ls="--", lw=1, label=f"1/pairs = 1/{t['num_kv_pairs']}")
        ax.axhline(2 / t["vocab_size"], color="k", ls=":", lw=1, label=f"chance (1 of {t['vocab_size'] // 2} values)")
    ax.set(xlabel="eval length (tokens)", ylabel=name, title=f"{task}: trained at T={t['seq_len']}")
    log_ticks(ax, lengths)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


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
        trained = [e for e in t["entries"] if not res.quantized(e)]
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
    summary.json has it (the text task, once the data issue adds the buckets), for the tasks not evaluated once."""
    out = []
    for task, t in res.tasks.items():
        if res.evaluated_once(task):
            continue  # a smoke test: task_section says so
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
            name = label(entry, res.layers(task, entry)) + f" at {tokens(L)}"
            ax.plot([p + 1 for p in buckets], list(buckets.values()), marker="o", **line_style(entry), label=name)
        ax.axvline(t["seq_len"], color="gray", ls="--", lw=1, label=f"training length {t['seq_len']}")
        ax.set(xscale="log", xlabel="position (tokens, bucket start + 1)", ylabel="mean loss in the bucket")
        ax.set_title(f"{task}: loss by position (selection split, first seed)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        out += [f"### {task}: loss by position", "", f"![position]({rel}/{save(fig, figdir / f'position_{task}.png')})"]
        out += [""]
    return out


CURVE_ROWS = ("held-out", "train loss vs tokens", "train loss vs wall time")  # the training-curves figure's rows


def curve_runs(res: Results, task: str) -> dict[str, dict]:
    """{headline entry: its best first-seed run} on `task`, for the entries with a finished run there."""
    out = {}
    for entry in (e for e in res.roles["headline"] if e in res.tasks[task]["entries"]):
        runs = [r for r in res.best_runs(task, entry) if r["summary"]]
        if runs:
            out[entry] = runs[0]
    return out


def curve_panels(runs: dict[str, dict]) -> list[str]:
    """The rows of CURVE_ROWS a task's runs have data for: held-out where a summary kept its eval curve, both
    training-loss rows where a run kept its training-loss curve."""
    panels = ["held-out"] if any(r["summary"].get("eval_curve") for r in runs.values()) else []
    return panels + (list(CURVE_ROWS[1:]) if any(r.get("train_curve") for r in runs.values()) else [])


def curves_section(res: Results, figdir: Path, rel: str) -> list[str]:
    """The best first-seed run of each headline entry: its held-out metric against tokens (the trainer's evals,
    `summary.eval_curve`), and its training loss against tokens and against wall time (`train_curve`, read from
    TensorBoard when collected). Only panels with curves are drawn: one column per task with any, one row per
    quantity any task has; the tasks evaluated once (smoke tests) are left out, and the tasks whose runs kept no
    training-loss curve are named.

    Args:
        res: the comparison's results.
        figdir: the folder curves.png is written to.
        rel: that folder relative to the report, for the link.

    Returns:
        The section's Markdown lines.
    """
    tasks = [t for t in res.tasks if not res.evaluated_once(t)]
    runs = {task: curve_runs(res, task) for task in tasks}
    panels = {task: curve_panels(runs[task]) for task in tasks}
    columns = [task for task in tasks if panels[task]]
    rows = [row for row in CURVE_ROWS if any(row in panels[task] for task in columns)]
    missing = [task for task in tasks if "train loss vs tokens" not in panels[task]]
    lines = [
        "## Training curves",
        "",
        f"TensorBoard for all runs: `tensorboard --logdir {res.quality.get('runs_dir', '')}`.",
        "",
    ]
    if missing:
        lines += [
            f"No training-loss curve for {', '.join(missing)}: those runs were collected before quality.json kept"
            " curves and their folders are not on this machine (the held-out curves their summaries kept are drawn).",
            "",
        ]
    if not columns:
        return lines + ["No run kept a curve.", ""]
    fig = Figure(figsize=(5 * len(columns), 3.7 * len(rows)))
    for col, task in enumerate(columns):
        axes = {
            row: fig.add_subplot(len(rows), len(columns), i * len(columns) + col + 1)
            for i, row in enumerate(rows)
            if row in panels[task]
        }
        _draw_curves(res, task, runs[task], axes)
        next(iter(axes.values())).legend(fontsize=7)
    return lines + [f"![curves]({rel}/{save(fig, figdir / 'curves.png')})", ""]


def _draw_curves(res: Results, task: str, runs: dict[str, dict], axes: dict) -> None:
    """Draw the task's runs into `axes` ({row of CURVE_ROWS: its axes}, only the rows it has data for)."""
    tokens_per_step = res.tasks[task]["tokens_per_run"] / max(1, _steps(res, task))
    metric = "metric"
    for entry, run in runs.items():
        name, summary, curve = label(entry, res.layers(task, entry)), run["summary"], run.get("train_curve")
        style = dict(**line_style(entry), label=name)
        if "held-out" in axes and summary.get("eval_curve"):
            steps, values = zip(*summary["eval_curve"])
            metric = summary.get("rule", {}).get("metric", metric)
            axes["held-out"].plot([s * tokens_per_step for s in steps], values, marker="o", markersize=3, **style)
        if "train loss vs tokens" in axes and curve:
            steps, wall, loss = zip(*curve)
            axes["train loss vs tokens"].plot([s * tokens_per_step for s in steps], loss, **style)
            axes["train loss vs wall time"].plot(wall, loss, **style)
    loss, wall_clock = "loss (nats per token)", "seconds since the run started (with compilation)"
    labels = {
        "held-out": (f"held-out {metric} vs tokens", "tokens", f"held-out {metric}"),
        "train loss vs tokens": ("train loss vs tokens", "tokens", loss),
        "train loss vs wall time": ("train loss vs wall time", wall_clock, loss),
    }
    for row, ax in axes.items():
        title, xlabel, ylabel = labels[row]
        ax.set(title=f"{task}: {title}", xlabel=xlabel, ylabel=ylabel)


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
