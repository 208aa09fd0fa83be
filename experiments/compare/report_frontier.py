"""The ablation table and the recall-memory frontier of the comparison report (Zoology's figure, one panel per
training length): MQAR accuracy at each test length (1x-16x) against decode-state bytes per sequence there, for
softmax's KV cache (float and quantized), windows, power retention at several degrees and head dims, the other
fixed-state mixers (float32 and quantized states) and the hybrids; and at which lengths a fixed state beats the
4-bit KV cache.
"""

from pathlib import Path

from matplotlib.figure import Figure

from experiments.compare.results import Results
from experiments.formatting import human_bytes, md_table, tokens
from experiments.plotting import label, line_style, save


def ablation_section(res: Results, task: str | None) -> list[str]:
    """One row per ablation: what it changes, its base's and its own test metric at each length, and the change."""
    if task is None or not res.roles["ablations"]:
        return []
    lengths = res.test_lengths(task)[:2] or [res.tasks[task]["seq_len"]]
    rows = []
    for entry in res.roles["ablations"]:
        base = res.entries[entry]["base"]
        row = [entry, res.entries[entry]["change"], label(base, res.layers(task, base))]
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


def stored_as(res: Results, entry: str) -> str:
    """How the entry stores its decode memory when quantized.

    Args:
        res: the comparison's results.
        entry: one of its entries.

    Returns:
        "KV int8", "KV 4-bit", "state int8", "state fp8" (or another state format), else "" (as trained: a float KV
        cache or float32 states).
    """
    spec = res.entries[entry]
    if spec["kv_cache_bits"] is not None:
        return "KV int8" if spec["kv_cache_bits"] == 8 else f"KV {spec['kv_cache_bits']}-bit"
    return f"state {spec['state_format']}" if spec.get("state_format") else ""


MARKERS = {"": "o", "KV int8": "D", "KV 4-bit": "v", "state int8": "s", "state fp8": "^"}  # else "o"


def frontier_label(res: Results, task: str, entry: str) -> str:
    """The entry's frontier label.

    Args:
        res: the comparison's results.
        task: the task (its runs give the layers).
        entry: one of its entries.

    Returns:
        Its name, layers with their recipe (`Results.layers`) and, when quantized, how it stores its memory:
        "power_state_int8 (PP, no RoPE, degree 2, state int8)", "softmax_kv4 (AA, RoPE, KV 4-bit)".
    """
    kinds, stored = res.layers(task, entry), stored_as(res, entry)
    return label(entry, f"{kinds}, {stored}" if stored else kinds)


def frontier_entries(res: Results, task: str) -> list[str]:
    """The headline and frontier entries of `task` (ablations of parts other than memory are left out)."""
    names = [*res.roles["headline"], *res.roles["frontier"]]
    return [e for e in dict.fromkeys(names) if e in res.tasks[task]["entries"]]


def frontier_lengths(res: Results, task: str) -> list[int]:
    """The lengths the frontier of `task` is read at: its test lengths with cache bytes (else its training one)."""
    by_length = res.tasks[task].get("cache_bytes_by_length") or {}
    lengths = sorted({int(L) for bytes_at in by_length.values() for L in bytes_at})
    return lengths or [res.tasks[task]["seq_len"]]


def state_bytes(res: Results, task: str, entry: str, L: int) -> int:
    """The entry's decode-state bytes per sequence at length L."""
    by_length = res.tasks[task].get("cache_bytes_by_length") or {}
    return res.cache_bytes(task, entry, L) if by_length else res.cache_bytes(task, entry)


def fixed_state_verdicts(res: Results, task: str, lengths: list[int]) -> list[str]:
    """For each entry whose state does not grow over the lengths (a fixed state, or a window past its width):
    the lengths at which it beats the 4-bit KV cache (higher accuracy, no more bytes), ties it, and those where
    it does not (and why). Empty without a 4-bit cache entry."""
    kv4 = next((e for e in frontier_entries(res, task) if res.entries[e]["kv_cache_bits"] == 4), None)
    if kv4 is None:
        return []
    out = []
    for entry in frontier_entries(res, task):
        sizes = {L: state_bytes(res, task, entry, L) for L in lengths}
        if res.entries[entry]["kv_cache_bits"] is not None or len(set(sizes.values())) > 1:
            continue
        beats, ties, below, larger, pending = [], [], [], [], []
        for L in lengths:
            own, cache = res.cell(task, entry, L), res.cell(task, kv4, L)
            if not (own.n and cache.n):
                pending.append(L)
            elif sizes[L] > state_bytes(res, task, kv4, L):
                larger.append(L)
            elif own.mean > cache.mean:
                beats.append(L)
            elif own.mean == cache.mean:
                ties.append(L)
            else:
                below.append(L)
        parts = [
            f"beats it at {_lengths(beats)}" if beats else "beats it at no length",
            *([f"ties at {_lengths(ties)}"] if ties else []),
            *([f"below its accuracy at {_lengths(below)}"] if below else []),
            *([f"more bytes than the cache at {_lengths(larger)}"] if larger else []),
            *([f"pending at {_lengths(pending)}"] if pending else []),
        ]
        state = human_bytes(next(iter(sizes.values())))
        out.append(f"- {frontier_label(res, task, entry)}, {state} at every length: " + "; ".join(parts))
    return out


def _lengths(lengths: list[int]) -> str:
    return ", ".join(tokens(L) for L in lengths)


def frontier_section(res: Results, tasks: list[str], figdir: Path, rel: str) -> list[str]:
    """The frontier of each training length (one task each): test accuracy at each test length against the
    decode-state bytes there (a table, one panel of a log-x plot per training length), and where each fixed
    state beats the 4-bit KV cache of no fewer bytes."""
    if not tasks:
        return []
    fig = Figure(figsize=(6.5 * len(tasks), 8.0))  # the legends below the axes, off the points
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    out = [
        "## The frontier: recall against decode-state bytes, by training length",
        "",
        "Bytes per sequence of the decode caches at each test length (a KV cache grows with it; a fixed state, or "
        "a window past its width, does not); the quantized caches (`KV int8`, `KV 4-bit`: int8 and 4-bit "
        "keys and values, a bfloat16 scale per 16) are softmax's trained runs decoded through that cache, and the "
        "quantized states (`state int8`, `state fp8`: int8 with a bfloat16 scale, fp8 e4m3 with a float32 scale, "
        "per state row) are each fixed-state model's trained runs decoded token by token with every recurrent "
        "state re-quantized after every token (`generate(..., state_format=...)`'s path; their bytes: the "
        "quantized states and scales, and the rest of the cache as it is). A fixed state *beats* the 4-bit cache "
        "at a length where its test accuracy is above the cache's with no more bytes (the same accuracy: a tie).",
        "",
    ]
    for ax, task in zip(axes, tasks):
        t, lengths = res.tasks[task], frontier_lengths(res, task)
        entries = sorted(frontier_entries(res, task), key=lambda e: state_bytes(res, task, e, lengths[0]))
        rows = []
        for entry in entries:
            cells = [res.cell(task, entry, L) for L in lengths]
            sizes = [state_bytes(res, task, entry, L) for L in lengths]
            name = frontier_label(res, task, entry)
            rows.append([name, human_bytes(sizes[0]), human_bytes(sizes[-1])] + [c.text() for c in cells])
            drawn = [(b, c) for b, c in zip(sizes, cells) if c.n]
            if drawn:
                xs, ys = [b for b, _ in drawn], [c.mean for _, c in drawn]
                err = [[c.below for _, c in drawn], [c.above for _, c in drawn]]
                marker = MARKERS.get(stored_as(res, entry), "o")
                ax.errorbar(xs, ys, yerr=err, fmt=marker, ms=3, lw=1, capsize=2, **line_style(entry), label=name)
        if t["num_kv_pairs"]:
            ax.axhline(1 / t["num_kv_pairs"], color="gray", ls="--", lw=1, label=f"1/pairs = 1/{t['num_kv_pairs']}")
        ax.set(xscale="log", xlabel="decode-state bytes per sequence at the eval length (log)", ylabel="test accuracy")
        ax.set_title(f"{task}: trained at T={t['seq_len']}, evaluated at {_lengths(lengths)}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.13))
        header = ["model (layers)", f"bytes @{tokens(lengths[0])}", f"bytes @{tokens(lengths[-1])}"]
        header += [f"@{tokens(L)}" for L in lengths]
        out += [
            f"### {task}: trained at T={tokens(t['seq_len'])}, test {res.metric(task).labels[0]}",
            "",
            md_table(header, rows),
            "",
        ]
        if verdicts := fixed_state_verdicts(res, task, lengths):
            out += ["Fixed states against the 4-bit KV cache:", "", *verdicts, ""]
    return out + [f"![frontier]({rel}/{save(fig, figdir / 'frontier.png')})", ""]
