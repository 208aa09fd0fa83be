"""The long-context answer in one table and one figure: for every model, the loss by position read whole to L
(text.json), MQAR and passkey recall against context (one or more recall JSONs), and what the model holds and
spends at L (the decode caches' bytes, the read time per token), side by side.

    python -m experiments.long_context mission --text results/long_context/text.json \
        --recall results/long_context/recall.json results/long_context/recall_passkey.json

A row is one model name read one way (RoPE as trained, or a scaling): the text JSON's rows and every recall row of
that name and reading, each averaged over its runs (seeds), with their range. The text
and recall models are separate trainings (a text run, MQAR runs, a passkey run) of the same mixer and recipe; the
page says which runs each column reads.
"""

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from experiments.formatting import human_bytes, md_table, tokens
from experiments.long_context.models import AS_TRAINED
from experiments.long_context.report import (
    STYLES,
    commands,
    plot_position,
    position_ticks,
    spread,
    spread_cell,
    text_groups,
)
from experiments.plotting import color, log_ticks, save

TASK_METRICS = {"mqar": "accuracy", "passkey": "exact_match"}


def _key(row: dict) -> tuple[str, str]:
    return row["name"], row["rope"]


def recall_spread(recalls: list[dict], task: str) -> dict[tuple[str, str], dict[int, tuple[float, float, float, int]]]:
    """Recall of each model name and reading at each length over its runs.

    Args:
        recalls: recall results (`python -m experiments.long_context recall` JSONs, as read).
        task: "mqar" (accuracy) or "passkey" (exact match).

    Returns:
        {(name, rope): {L: (mean, min, max, runs)}} over the rows of that task read at L.
    """
    metric, values = TASK_METRICS[task], {}
    for result in recalls:
        for row in result["models"]:
            if row["task"] != task:
                continue
            for L, cell in row["lengths"].items():
                values.setdefault(_key(row), {}).setdefault(int(L), []).append(cell[metric])
    return {key: {L: spread(v) for L, v in sorted(by_length.items())} for key, by_length in values.items()}


def mission_rows(text: dict, recalls: list[dict]) -> list[dict]:
    """One row per model name and reading, in the text JSON's order (its runs pooled: `report.text_groups`), then
    recall-only models.

    Args:
        text: a `long_context text` result (as read).
        recalls: `long_context recall` results (as read).

    Returns:
        [{"name", "rope", "label", "bits_per_byte" (a spread), "last_bucket" ((lo, hi, spread) or None),
        "cache_bytes", "seconds_per_token", "mqar": {L: spread}, "passkey": {L: spread}}], a spread being (mean,
        min, max, runs); text fields None for a model the text JSON lacks.
    """
    spreads = {task: recall_spread(recalls, task) for task in TASK_METRICS}
    rows, seen = [], set()
    for group in text_groups(text["models"]):
        last = group["buckets"][-1]
        rows.append(
            {
                **{key: group[key] for key in ("name", "rope", "label", "bits_per_byte", "cache_bytes")},
                "last_bucket": (last["lo"], last["hi"], last["bits_per_byte"]),
                "seconds_per_token": group["seconds_per_token"],
                **{task: spreads[task].get(_key(group), {}) for task in TASK_METRICS},
            }
        )
        seen.add(_key(group))
    labels = {_key(r): r["label"] for result in recalls for r in result["models"]}
    for key in dict.fromkeys(k for task in TASK_METRICS for k in spreads[task]):
        if key not in seen:
            empty = dict.fromkeys(("bits_per_byte", "last_bucket", "cache_bytes", "seconds_per_token"))
            rows.append({"name": key[0], "rope": key[1], "label": labels[key], **empty})
            rows[-1].update({task: spreads[task].get(key, {}) for task in TASK_METRICS})
    return rows


def mission_markdown(rows: list[dict], lengths: list[int], text: dict, recalls: list[dict], figure: str) -> str:
    """The page: the table (bits per byte over L and in its last bucket, MQAR and passkey at each length, the
    caches at L and the read time per token), the figure and the commands of every number.

    Args:
        rows: `mission_rows`.
        lengths: the recall lengths, columns.
        text: the text result (its length, documents, machine and command).
        recalls: the recall results (their commands and settings).
        figure: the figure's file name.

    Returns:
        Markdown.
    """
    L = text["length"]
    lo, hi = next(r["last_bucket"][:2] for r in rows if r["last_bucket"])
    header = ["model", f"bpb, all {tokens(L)}", f"bpb, [{tokens(lo)}, {tokens(hi)})"]
    tasks = [task for task in TASK_METRICS if any(row[task] for row in rows)]  # a task no result read: no columns
    header += [f"{'MQAR' if task == 'mqar' else task} @{tokens(n)}" for task in tasks for n in lengths]
    header += [f"caches at {tokens(L)}", "read s / token"]
    table = []
    for row in rows:
        cells = [row["label"], spread_cell(row["bits_per_byte"])]
        cells.append(spread_cell(None if row["last_bucket"] is None else row["last_bucket"][2]))
        cells += [spread_cell(row[task].get(n)) for task in tasks for n in lengths]
        cells.append("-" if row["cache_bytes"] is None else human_bytes(row["cache_bytes"]))
        per_token = row["seconds_per_token"]
        cells.append("-" if per_token is None else f"{per_token * 1e6:.0f} us")
        table.append(cells)
    sources = "\n".join(
        f"- recall ({', '.join(sorted({r['task'] for r in res['models']}))}, at least {res['queries']} queries a "
        f"length, MQAR gap {res['gap_fraction']:g} L): {commands(res)}"
        for res in recalls
    )
    return (
        f"# Long context: quality, recall and cost at {tokens(L)}\n\n"
        f"Bits per byte: held-out documents ({text['documents']['count']}) read whole to {L:,} tokens "
        f"({text['machine']['device']}, {text['machine']['date']}). MQAR: accuracy, every query more than the gap "
        "after its key; passkey: exact match. Cells: the mean over the runs (seeds) read, with their range and "
        "count when more than one. `caches at L`: the decode caches of the text model at L (one "
        "row); `read s / token`: the text reading's seconds over its tokens (one compiled forward or the carry "
        "path, compilation included), on the machine named. Text and recall columns are separate trainings of the "
        "same mixer and recipe; '-': not read (the source's notes say why).\n\n"
        f"{md_table(header, table)}\n\n![long context]({figure})\n\n## Sources\n\n"
        f"- text: {commands(text)}\n{sources}\n"
    )


def mission_figure(text: dict, rows: list[dict], lengths: list[int], path: Path) -> str:
    """Three panels: loss by position to L (mean over runs, range as a band); MQAR accuracy against length (mean
    over runs, range as bars); the caches' bytes at L against the mean bits per byte of the last bucket. Returns the
    file name."""
    fig = Figure(figsize=(16, 4.6))
    loss_ax, recall_ax, bytes_ax = fig.subplots(1, 3)
    for i, group in enumerate(text_groups(text["models"])):
        style = dict(color=color(group["name"]) or f"C{i}", ms=3, marker="o", label=group["label"])
        plot_position(loss_ax, group, STYLES[group["rope"]], **style)
    log_ticks(loss_ax, position_ticks(text["length"]))
    loss_ax.set(xlabel="position (tokens)", ylabel="held-out loss (bits per byte)", title="loss by position")
    for i, row in enumerate(rows):
        points = [(n, *row["mqar"][n][:3]) for n in lengths if n in row["mqar"]]
        if points:
            n, mean, low, high = np.array(points).T
            style = dict(color=color(row["name"]) or f"C{i}", ls=STYLES[row["rope"]], marker="o", capsize=3)
            recall_ax.errorbar(n, mean, yerr=[mean - low, high - mean], label=row["label"], **style)
        if row["cache_bytes"] is not None:
            mark = "o" if row["rope"] == AS_TRAINED else "x"
            late = row["last_bucket"][2][0]
            bytes_ax.scatter(row["cache_bytes"], late, color=color(row["name"]) or f"C{i}", marker=mark)
            bytes_ax.annotate(row["label"].split(" (")[0], (row["cache_bytes"], late), fontsize=7)
    log_ticks(recall_ax, lengths)
    recall_ax.set(ylim=(-0.02, 1.02), xlabel="context (tokens)", ylabel="MQAR accuracy", title="recall at long gaps")
    bytes_ax.set_xscale("log")
    lo, hi = next(r["last_bucket"][:2] for r in rows if r["last_bucket"])
    bytes_ax.set(
        xlabel=f"decode caches at {tokens(text['length'])} (bytes)", ylabel=f"bpb in [{tokens(lo)}, {tokens(hi)})"
    )
    bytes_ax.set_title("memory against late-context loss")
    for ax in (loss_ax, recall_ax, bytes_ax):
        ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=6)
    recall_ax.legend(fontsize=6)
    return save(fig, path)
