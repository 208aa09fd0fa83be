"""The speed and memory sections of the comparison report: train-step time against T, decode time against context,
cache bytes against context (speed.json of experiments/compare/speed.py), and the op alone (experiments/op_speed.py).
"""

from pathlib import Path

from matplotlib.figure import Figure

from experiments.formatting import human_bytes, md_table, times, tokens
from experiments.plotting import color, label, log_ticks, save

MIB = 2**20


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
        color_m = color(m)
        axes[0].plot(lengths, [step_s(m, T) for T in lengths], "o-", color=color_m, label=name[m])
        axes[1].plot([int(c) for c in contexts], [ms[m][c] for c in contexts], "o-", color=color_m)
        cache_mib = [res[m]["cache_bytes"][c] / MIB for c in cache_ctx]
        axes[2].plot([int(c) for c in cache_ctx], cache_mib, "o-", color=color_m)
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


MATRIX_STATE_NAMES = {"linear_attention": "linear attn.", "gla": "GLA", "gated_delta_rule": "gated delta rule"}


def op_section(op: dict) -> list[str]:
    """The op-level tables of experiments/op_speed.py: forward+backward of power (c=128), softmax and the
    matrix-state ops (chunk 64) where measured, and decode per token against the KV cache."""
    train = {(r["name"], r["T"]): r for r in op["rows"] if r["kind"] == "train"}
    lengths = sorted({T for _, T in train})
    matrix = [m for m in MATRIX_STATE_NAMES if any(name == f"{m} c=64" for name, _ in train)]
    cfg, rate = op["config"], op["matmul_gflops"]
    seconds = lambda r: f"{r['fwd_bwd_s']:.3g} s" if r else "-"
    rows = []
    for T in lengths:
        p, s = train.get(("power c=128", T)), train.get(("softmax blockwise", T))
        if p and s:
            speedup, share = times(s["fwd_bwd_s"] / p["fwd_bwd_s"]), f"{100 * p['gflops_fwd_bwd'] / rate:.0f}%"
            others = [seconds(train.get((f"{m} c=64", T))) for m in matrix]
            rows.append([tokens(T), seconds(p), seconds(s), *others, speedup, share])
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
    decode_ops = [
        f"{MATRIX_STATE_NAMES[r['name']]} {r['ms_per_token']:.3g} ms ({r['state_bytes'] / 2**10:.0f} KiB)"
        for r in op["rows"]
        if r["kind"] == "decode_op"
    ]
    header = ["T", "power c=128", "softmax", *(f"{MATRIX_STATE_NAMES[m]} c=64" for m in matrix)]
    out = [
        "## The op alone (experiments/op_speed.py)",
        "",
        f"One layer's mixer, B={cfg['batch']}, H={cfg['heads']}, d={cfg['head_dim']}, float32, forward+backward; "
        f"matmul rate {rate:.0f} GFLOP/s on {op['machine']['backend']} "
        f"({op['machine'].get('usable_cpus', op['machine'].get('cpus', '?'))} cores). {op['machine'].get('note', '')}",
        "",
        md_table([*header, "softmax / power", "power % of matmul rate"], rows),
        "",
        "Decode per token against a KV cache of the context (state read and write vs cache read):",
        "",
        md_table(["context", "power", "KV cache", "speed-up", "KV bytes / state bytes"], decode),
        "",
    ]
    if decode_ops:
        out += [f"The matrix-state ops' decode step at any context: {'; '.join(decode_ops)}.", ""]
    return out
