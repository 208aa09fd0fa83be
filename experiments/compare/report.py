"""The comparison report: reads a comparison's speed.json and quality.json (python -m experiments.compare.run) and
its runs' TensorBoard logs, and writes a Markdown report with tables and PNG plots.

    python -m experiments.compare.report results/compare/cpu --out results/REPORT.md

As `python -m experiments.compare.run --report-only` does, it leaves out the speed results measured with another
recipe than the preset's (the preset named in the folder's JSON) and names them.

Sections: the machine and date; the headline (per model, what it buys: train-step and decode speed and cache bytes
at the longest length; what it costs: each task at 1x, 16x and the longest length); the hand-written reading
<data>/NOTES.md if present; speed and memory (report_speed.py); the protocol, each task, the learning-rate sweeps
(report_quality.py); ablations and the frontier (report_frontier.py); loss by position; training curves; every
run's command. Every model is named with its layers' mixers (`hybrid (PA)`).
"""

import argparse
import json
import os
from pathlib import Path

from experiments.compare.presets import PRESETS
from experiments.compare.report_frontier import ablation_section, frontier_section
from experiments.compare.report_quality import (
    curves_section,
    lr_section,
    position_section,
    protocol_section,
    runs_appendix,
    task_section,
)
from experiments.compare.report_speed import op_section, speed_section
from experiments.compare.results import Results
from experiments.compare.speed import same_recipe, speed_recipes
from experiments.formatting import human_bytes, md_table, times, tokens
from experiments.plotting import label


def headline_lengths(res: Results, task: str) -> list[int]:
    """The task's headline lengths: the training length, the longest multiple of it, the longest of all."""
    lengths = res.test_lengths(task)
    if not lengths:
        return [res.tasks[task]["seq_len"]]
    T = res.tasks[task]["seq_len"]
    multiples = [L for L in lengths if L % T == 0 and L // T <= 16]
    return sorted({T, max(multiples, default=T), max(lengths)})


def headline_section(speed: dict | None, res: Results | None) -> list[str]:
    """One row per headline model: what it buys (speed at the longest T and context, cache bytes there) and what
    it costs (each task's test metric at its headline lengths). Models are named with the speed runs' layers (else
    the first task's); a task whose models have other layers says so."""
    if speed:
        kinds = {m: r["layer_kinds"] for m, r in speed["results"].items()}
    models = list(res.roles["headline"]) if res else list(kinds)
    if not speed:
        first = next(iter(res.tasks))
        kinds = {m: res.layer_kinds(first, m) for m in models}
    # each model with its layers' recipe, from the first task it trained on
    named = {m: next((res.layers(t, m) for t in res.tasks if res.summary(t, m)), "?") for m in models} if res else {}
    header, cells = ["model (layers)"], {m: [label(m, named.get(m) or kinds.get(m, "?"))] for m in models}
    if speed:
        out = speed["results"]
        T = max(r["T"] for r in out["softmax"]["train"])
        ctx = max(out["softmax"]["decode"], key=int)
        header += [f"train-step speed-up at {tokens(T)}", f"decode ms/token at {tokens(int(ctx))}", "cache there"]
        for m in models:
            if m not in out:
                cells[m] += ["-", "-", "-"]
                continue
            step = lambda name: next(r["step_s"] for r in out[name]["train"] if r["T"] == T)
            ms = out[m]["decode"][ctx]["ms_per_token"]
            speedup = times(out["softmax"]["decode"][ctx]["ms_per_token"] / ms)
            cells[m] += [
                times(step("softmax") / step(m)),
                f"{ms:.3g} ({speedup})",
                human_bytes(out[m]["cache_bytes"][ctx]),
            ]
    other = []
    for task in res.tasks if res else ():
        name = res.metric(task).labels[0]
        for L in headline_lengths(res, task):
            header.append(f"{task} {name} @{tokens(L)}")
            for m in models:
                cells[m].append(res.cell(task, m, L).text())
        differs = [f"{m} {res.layer_kinds(task, m)}" for m in models if res.layer_kinds(task, m) != kinds.get(m)]
        if differs:
            other.append(f"{task}: {', '.join(differs)}")
    note = f" Some tasks train other layers ({'; '.join(other)})." if other else ""
    return [
        "## Headline",
        "",
        "Speed-ups are softmax's time over the model's (below 1x: slower than softmax). Task columns: the test metric "
        "at the training length, at 16x (or the longest multiple) and at the longest length evaluated, mean (range) "
        "over seeds at each model's best learning rate." + note,
        "",
        md_table(header, [cells[m] for m in models]),
        "",
    ]


def read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def current_speed(speed: dict | None, recipes: dict[str, dict] | None) -> tuple[dict | None, list[str]]:
    """(speed.json with only the models measured with their `recipes` (None: all kept), the models left out)."""
    if speed is None or recipes is None:
        return speed, []
    results = speed["results"]
    kept = {m: r for m, r in results.items() if m in recipes and same_recipe(r.get("recipe"), recipes[m])}
    return ({**speed, "results": kept} if kept else None), [m for m in results if m not in kept]


def write_report(
    data: Path, out: Path, op_speed: Path | None = Path("results/op_speed.json"), speed_recipes: dict | None = None
) -> None:
    """Write the report of the comparison in `data` to `out`, its PNGs into `data`. `speed_recipes` ({model: the
    preset's speed recipe}): speed results measured with another recipe are left out, and the report says so."""
    measured, quality = read(data / "speed.json"), read(data / "quality.json")
    speed, stale = current_speed(measured, speed_recipes)
    meta = speed or quality or measured
    if meta is None:
        raise SystemExit(f"neither speed.json nor quality.json in {data}: run python -m experiments.compare.run first")
    res = Results(quality) if quality else None
    mach = meta["machine"]
    rel = os.path.relpath(data, out.parent)
    commands = sorted({m["command"] for m in (speed, quality) if m})
    lines = [
        f"# Power retention against softmax: the `{meta['preset']}` comparison",
        "",
        f"Machine: {mach['device']} ({mach['backend']}, {mach['devices']} device(s), {mach['cpus']} CPU cores), "
        f"JAX {mach['jax']}; {mach['date']}. Made by {', '.join(f'`{c}`' for c in commands)}.",
        "",
    ]
    lines += headline_section(speed, res)
    if (data / "NOTES.md").exists():
        lines += [(data / "NOTES.md").read_text(), ""]
    if stale:
        lines += [
            "## Speed and memory",
            "",
            f"Not shown for {', '.join(stale)}: speed.json holds their times measured with another recipe (model "
            "overrides or speed settings) than the preset's; the speed stage measures them again.",
            "",
        ]
    if speed:
        lines += speed_section(speed, data, rel)
    if op_speed is not None and op_speed.exists():
        lines += op_section(json.loads(op_speed.read_text()))
    if res:
        lines += protocol_section(res) + ["## Quality", ""]
        for task in res.tasks:
            lines += task_section(res, task, data, rel)
        lines += ablation_section(res, _role_task(res, "ablations"))
        frontier_tasks = res.frontier_tasks() or [t for t in [_role_task(res, "frontier")] if t]
        lines += frontier_section(res, frontier_tasks, data, rel)
        lines += position_section(res, data, rel) + lr_section(res) + curves_section(res, data, rel)
        lines += runs_appendix(res)
    out.write_text("\n".join(lines))


def _role_task(res: Results, role: str) -> str | None:
    """The task the ablations (or the frontier) ran on: the one whose entries include them."""
    return next((t for t, spec in res.tasks.items() if set(res.roles[role]) & set(spec["entries"])), None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="a comparison folder with speed.json and/or quality.json")
    parser.add_argument("--out", type=Path, help="the Markdown report (default <data>/REPORT.md)")
    args = parser.parse_args(argv)
    out = args.out or args.data / "REPORT.md"
    meta = read(args.data / "quality.json") or read(args.data / "speed.json")
    preset = PRESETS.get(meta["preset"]) if meta else None
    write_report(args.data, out, speed_recipes=speed_recipes(preset) if preset else None)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
