"""The long-context results as figures and Markdown: the loss by position (one colour per model, a line style per
RoPE reading) and recall against length, each with its table and the recipe of its numbers."""

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from experiments.formatting import human_bytes, md_table, tokens
from experiments.long_context.models import AS_TRAINED
from experiments.plotting import color, log_ticks, save

STYLES = {AS_TRAINED: "-", "linear": "--", "llama3": ":"}  # a line style per RoPE reading
TRAINED_MARKERS = "o^s"  # a marker per training length in one figure, shortest first
TABLE_BUCKETS = 5  # the text table's last position buckets


def _bytes(n) -> str:
    return "" if n is None else human_bytes(n)


def _cost(row: dict) -> list[str]:
    """A row's reading cost: path, seconds, the forward's bytes (XLA), the caches at L."""
    path = row["path"] if row["path"] == "forward" else f"carry ({tokens(row['segment'])} a step)"
    return [path, f"{row['seconds']:.1f}", _bytes(row["forward_bytes"]), _bytes(row["cache_bytes"])]


def position_ticks(length: int) -> list[int]:
    """Ticks for a position axis up to `length`: 1, 16, 256, ... (powers of 16) and `length`."""
    ticks = [16**i for i in range(8) if 16**i < length]
    return [*ticks, length]


def spread(values: list[float]) -> tuple[float, float, float, int]:
    """(mean, min, max, count) of one number over runs (seeds)."""
    return float(np.mean(values)), min(values), max(values), len(values)


def spread_cell(cell: tuple[float, float, float, int] | None) -> str:
    """A `spread` as a table cell: the mean, with the range and count when more than one run; '-' for None."""
    if cell is None:
        return "-"
    mean, low, high, runs = cell
    return f"{mean:.3f}" if runs == 1 else f"{mean:.3f} ({low:.3f}-{high:.3f}, {runs} runs)"


def text_groups(models: list[dict]) -> list[dict]:
    """The text rows of one model, reading and training length pooled over their runs (seeds), in the order each
    first appears. Every run of a group reads the same documents and positions, so a bucket's spread is over runs.

    Args:
        models: a `text` result's rows (as read).

    Returns:
        [{"name", "rope", "label", "trained_length", "runs" (their folders), "bits_per_byte" (a `spread`),
        "buckets" ([{"lo", "hi", "bits_per_byte": spread or None}]), "cache_bytes", "seconds_per_token" (the mean
        over runs)}].

    Raises:
        ValueError: two runs of a group were read at other positions (naming both runs).
    """
    grouped = {}
    for row in models:
        grouped.setdefault((row["name"], row["rope"], row["trained_length"]), []).append(row)
    groups = []
    for rows in grouped.values():
        edges = [(b["lo"], b["hi"]) for b in rows[0]["buckets"]]
        for row in rows[1:]:
            if [(b["lo"], b["hi"]) for b in row["buckets"]] != edges:
                raise ValueError(f"text rows {rows[0]['run']!r} and {row['run']!r} were read at other positions")
        buckets = []
        for i, (lo, hi) in enumerate(edges):
            values = [row["buckets"][i]["bits_per_byte"] for row in rows]
            buckets.append({"lo": lo, "hi": hi, "bits_per_byte": None if None in values else spread(values)})
        first = rows[0]
        groups.append(
            {
                **{key: first[key] for key in ("name", "rope", "label", "trained_length", "cache_bytes")},
                "runs": [row["run"] for row in rows],
                "bits_per_byte": spread([row["bits_per_byte"] for row in rows]),
                "buckets": buckets,
                "seconds_per_token": float(np.mean([row["seconds"] / row["tokens"] for row in rows])),
            }
        )
    return groups


def plot_position(ax, group: dict, fmt: str, **style) -> None:
    """One group's loss by position on `ax` (each bucket at its upper edge): the mean over its runs as a line in
    `fmt`, the runs' range as a band when there are several; the label counts the runs."""
    points = [(b["hi"], *b["bits_per_byte"][:3]) for b in group["buckets"] if b["bits_per_byte"] is not None]
    hi, mean, low, high = np.array(points).T
    runs = len(group["runs"])
    label = style.pop("label") + (f", mean of {runs} runs" if runs > 1 else "")
    (line,) = ax.plot(hi, mean, fmt, label=label, **style)
    if runs > 1:
        ax.fill_between(hi, low, high, color=line.get_color(), alpha=0.15, lw=0)


def text_figure(result: dict, path: Path) -> str:
    """Held-out bits per byte against position (each bucket at its upper edge), one colour per model, a line style
    per RoPE reading (the mean over a model's runs, their range as a band), a dotted grey line at each training
    length; where the models were trained at several lengths, a marker per training length (circles at the
    shortest) and the length in each label. Returns the file name."""
    fig = Figure(figsize=(7.5, 4.6))
    ax = fig.subplots()
    trained = sorted({row["trained_length"] for row in result["models"]})
    for i, group in enumerate(text_groups(result["models"])):
        style, marker = STYLES[group["rope"]], TRAINED_MARKERS[trained.index(group["trained_length"]) % 3]
        label = group["label"] + (f", trained at {tokens(group['trained_length'])}" if len(trained) > 1 else "")
        plot_position(ax, group, style, color=color(group["name"]) or f"C{i}", marker=marker, ms=3, label=label)
    for T in trained:
        ax.axvline(T, color="gray", ls=":", lw=0.8)
    log_ticks(ax, position_ticks(result["length"]))
    ax.set_xlabel("position in the document (tokens; bucket [lo, hi) drawn at hi; dotted: training length)")
    ax.set_ylabel("held-out loss (bits per byte)")
    ax.set_title(f"Loss by position, {result['documents']['count']} documents read whole to {tokens(result['length'])}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def text_markdown(result: dict, figure: str) -> str:
    """The text result's page: the table over runs (bits per byte over all positions and in the last buckets: the
    mean over a model's runs, with their range and count when several), each run's cost, the figure, the documents
    and the rule that chose them."""
    buckets = result["models"][0]["buckets"][-TABLE_BUCKETS:]
    names = [f"[{tokens(b['lo'])}, {tokens(b['hi'])})" for b in buckets]
    header = ["model", "trained at", "bpb, all", *names]
    rows = []
    for group in text_groups(result["models"]):
        tail = {(b["lo"], b["hi"]): b["bits_per_byte"] for b in group["buckets"]}
        cells = [spread_cell(tail[b["lo"], b["hi"]]) for b in buckets]
        rows.append([group["label"], tokens(group["trained_length"]), spread_cell(group["bits_per_byte"]), *cells])
    runs_header = ["model", "run", "bpb, all", "path", "seconds", "forward bytes", "cache at L"]
    runs = [
        [row["label"], "/".join(Path(row["run"]).parts[-2:]), f"{row['bits_per_byte']:.3f}", *_cost(row)]
        for row in result["models"]
    ]
    docs = result["documents"]
    listing = "\n".join(f"- `{d['name']}` ({d['bytes']:,} bytes, sha256 `{d['sha256']}`)" for d in docs["chosen"])
    rule = ", ".join(f"{k}: {v}" for k, v in docs["rule"].items())
    return (
        f"# Loss by position at {tokens(result['length'])}\n\n{commands(result)} ({result['machine']['device']}, "
        f"{result['machine']['date']}). Held-out bits per byte of each model over {docs['count']} documents, each "
        f"read as one sequence of {result['length']:,} tokens from its start. Cells: the mean over a model's runs "
        "(seeds), with their range and count when there are several; the columns after `bpb, all` are position "
        "buckets [lo, hi). Each run: `path`, one compiled forward, or a prefill and decode steps carrying the "
        "caches; `forward bytes`, XLA's estimate of the compiled forward; `cache at L`, the decode caches at L "
        f"(one row).\n\n{md_table(header, rows)}\n\n![loss by position]({figure})\n\n## Each run\n\n"
        f"{md_table(runs_header, runs)}\n\n## Documents\n\nRule: {rule}."
        f"\n\n{listing}\n"
    )


def recall_figure(result: dict, path: Path) -> str:
    """Recall against length, one panel per task (MQAR accuracy, passkey exact match), one colour per model;
    returns the file name."""
    tasks = [t for t in ("mqar", "passkey") if any(row["task"] == t for row in result["models"])]
    fig = Figure(figsize=(6 * len(tasks), 4.2))
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks):
        metric = "accuracy" if task == "mqar" else "exact_match"
        for i, row in enumerate(r for r in result["models"] if r["task"] == task):
            points = sorted((int(L), v[metric]) for L, v in row["lengths"].items())
            style = STYLES[row["rope"]]
            ax.plot(*zip(*points), style, color=color(row["name"]) or f"C{i}", marker="o", label=row["label"])
        log_ticks(ax, result["lengths"])
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("sequence length (tokens)")
        if task == "mqar":
            ax.set_ylabel(f"accuracy (share of queries; gap {result['gap_fraction']:g} L)")
            ax.set_title(f"MQAR: at least {result['queries']} queries a length")
        else:
            ax.set_ylabel("exact match (share of passkeys, all five digits)")
            ax.set_title(f"passkey: at least {result['queries']} passkeys a length")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, path)


def commands(result: dict) -> str:
    """The command that made the result, or each in order when `--merge` added models: as Markdown code."""
    given = result["command"] if isinstance(result["command"], list) else [result["command"]]
    return ", then ".join(f"`{c}`" for c in given)


def recall_markdown(result: dict, figure: str) -> str:
    """The recall result's page: per task a table of the metric at each length with the queries read, and the
    cost at the longest."""
    parts = [
        f"# Recall at long context\n\n{commands(result)} ({result['machine']['device']}, "
        f"{result['machine']['date']}). MQAR: accuracy over at least {result['queries']} queries a length, every "
        f"query more than {result['gap_fraction']:g} L tokens after its key; passkey: exact match (all five digits) "
        f"over at least {result['queries']} passkeys a length, spread over the run's depths. Cells: the metric "
        "(queries read); the cost is that of the longest length.\n"
    ]
    for task, metric in (("mqar", "accuracy"), ("passkey", "exact_match")):
        rows = [r for r in result["models"] if r["task"] == task]
        if not rows:
            continue
        L_max = str(max(result["lengths"]))
        header = ["model", "run", "trained at", *(tokens(L) for L in result["lengths"]), "path", "seconds", "forward"]
        header.append("cache")
        table = []
        for row in rows:
            cells = [
                f"{row['lengths'][str(L)][metric]:.3f} ({row['lengths'][str(L)]['queries']})"
                if str(L) in row["lengths"]
                else ""
                for L in result["lengths"]
            ]
            cost = _cost(row["lengths"][L_max]) if L_max in row["lengths"] else [""] * 4
            run = "/".join(Path(row["run"]).parts[-2:])  # e.g. lr0.01/seed1: tells a model's seeds apart
            table.append([row["label"], run, tokens(row["trained_length"]), *cells, *cost])
        parts.append(f"## {task} ({metric.replace('_', ' ')})\n\n{md_table(header, table)}\n")
    parts.append(f"![recall]({figure})\n")
    return "\n".join(parts)
