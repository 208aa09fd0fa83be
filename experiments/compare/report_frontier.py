"""The ablation table and the recall-memory frontier of the comparison report (Zoology's figure): MQAR accuracy
against decode-state bytes per sequence at the task's length, for softmax's KV cache (float and quantized),
windows, power retention at several degrees and head dims, and the hybrids.
"""

from pathlib import Path

from matplotlib.figure import Figure

from experiments.compare.results import Results
from experiments.formatting import human_bytes, md_table, tokens
from experiments.plotting import color, label, save


def ablation_section(res: Results, task: str | None) -> list[str]:
    """One row per ablation: what it changes, its base's and its own test metric at each length, and the change."""
    if task is None or not res.roles["ablations"]:
        return []
    lengths = res.test_lengths(task)[:2] or [res.tasks[task]["seq_len"]]
    rows = []
    for entry in res.roles["ablations"]:
        base = res.entries[entry]["base"]
        row = [entry, res.entries[entry]["change"], label(base, res.layer_kinds(task, base))]
        for L in lengths:
            b, a = res.cell(task, base, L), res.cell(task, entry, L)
            delta = f"{a.mean - b.mean:+.3f}" if a.n and b.n else "-"
            row += [b.text(), a.text(), delta]
        rows.append(row)
    header = ["ablation", "changes", "base (layers)"]
    for L in lengths:
        header += [f"base @{tokens(L)}", f"ablated @{tokens(L)}", "change"]
    return [
        f"## Ablations ({task}, test {res.metric(task).labels[0]}, first seed of each at its best lr)",
        "",
        md_table(header, rows),
        "",
    ]


def frontier_entries(res: Results, task: str) -> list[str]:
    """The headline and frontier entries of `task` (ablations of parts other than memory are left out)."""
    names = [*res.roles["headline"], *res.roles["frontier"]]
    return [e for e in dict.fromkeys(names) if e in res.tasks[task]["entries"]]


def frontier_section(res: Results, task: str | None, figdir: Path, rel: str) -> list[str]:
    """The frontier's table and log-x plot: accuracy at the training length against decode-state bytes there."""
    if task is None:
        return []
    t = res.tasks[task]
    T = t["seq_len"]
    points = []
    for entry in frontier_entries(res, task):
        points.append((entry, res.cache_bytes(task, entry), res.cell(task, entry, T)))
    points.sort(key=lambda p: p[1])
    rows = [[label(e, res.layer_kinds(task, e)), human_bytes(b), f"{b:,}", c.text()] for e, b, c in points]
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.subplots()
    for entry, nbytes, cell in points:
        if cell.n:
            err = [[cell.below], [cell.above]]
            ax.errorbar([nbytes], [cell.mean], yerr=err, fmt="o", capsize=3, color=color(entry))
            ax.annotate(
                label(entry, res.layer_kinds(task, entry)),
                (nbytes, cell.mean),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
            )
    if t["num_kv_pairs"]:
        ax.axhline(1 / t["num_kv_pairs"], color="gray", ls="--", lw=1, label=f"1/pairs = 1/{t['num_kv_pairs']}")
        ax.axhline(2 / t["vocab_size"], color="k", ls=":", lw=1, label=f"chance (1 of {t['vocab_size'] // 2} values)")
        ax.legend(fontsize=7)
    ax.set(xscale="log", xlabel=f"decode-state bytes per sequence at T={T} (log)", ylabel="test accuracy at T")
    ax.set_title(f"{task}: recall against memory (T={T}, {t['num_kv_pairs']} pairs)")
    ax.grid(alpha=0.3, which="both")
    return [
        f"## The frontier: {task} accuracy against decode-state bytes at T={tokens(T)}",
        "",
        "Bytes per sequence of the decode caches at the training length (a KV cache grows with it, a power state "
        "does not); the quantized caches (`softmax_kv8`, `softmax_kv4`: int8 and 4-bit keys and values, a bfloat16 "
        "scale per 16) are softmax's trained runs decoded through that cache.",
        "",
        md_table(["model (layers)", "state bytes", "exact", f"accuracy @{tokens(T)}"], rows),
        "",
        f"![frontier]({rel}/{save(fig, figdir / 'frontier.png')})",
        "",
    ]
