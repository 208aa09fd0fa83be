"""The recovery bench: how much of a trained softmax LM comes back after converting its attention layers to power
retention and fine-tuning, with and without distillation, against the same pattern trained from scratch on the
same total tokens.

Recipe (every number in results/recovery.json carries it):
- the teacher: TEACHER (4 layers of full attention, GQA 4:2, head dim 16, d_model 64, byte tokens, no convolution
  or QK-norm, like a Llama block) trained `--teacher-steps` steps of 8 windows of T=512 on the text task (the
  standard library's .py files);
- each pattern of PATTERNS converted by `retention.nn.convert` (P gate bias 2) and evaluated before training;
- each converted model fine-tuned for `--fraction` of the teacher's tokens (lr 1e-3, 10 warm-up steps, cosine), plain
  and with KL distillation from the teacher (weight 1, temperature 1), evaluated `--evals` times on the way;
- each pattern trained from scratch with the teacher's sizes and recipe for the teacher's steps plus the
  fine-tune's, evaluated as often.
Every eval: `trainer.eval_batches` held-out batches at T and 16T (8k), bits per byte and loss by position.

    python -m experiments.recovery                       # runs under outputs/recovery (finished runs reused)
    python -m experiments.recovery --teacher-steps 40 --root /tmp/r --out /tmp/r.json   # a smoke run
Writes --out (JSON), its Markdown beside it (.md) and the figure (.png).
"""

import argparse
import json
import os
from pathlib import Path
from statistics import mean

from flax import nnx
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from experiments import conversion_loss
from experiments.compare.convergence import learning_curve
from experiments.compare.runs import train_loss_curve
from experiments.formatting import md_table
from experiments.hydra_run import train_once, with_overrides
from experiments.plotting import save
from retention import load_run
from retention.nn import convert
from retention.nn.config import check_pattern
from retention.train.config import build, register_configs
from retention.train.evaluate import evaluate
from retention.train.step import make_eval_step
from retention.validation import check_int, check_number

LONG = 16  # the long eval: 16x the training length
SEQ_LEN, BATCH = 512, 8
TEACHER = list(  # conversion_loss's teacher at T=512 with its eval at 16T
    with_overrides(
        tuple(conversion_loss.TEACHER),
        f"data.seq_len={SEQ_LEN}",
        f"data.batch_size={BATCH}",
        "trainer.eval_batches=2",
        f"trainer.eval_scales=[1,{LONG}]",
    )
)
PATTERNS = ("PA", "PPPA", "P")
DISTILL = {"plain": [], "KL": ["distill.kl_weight=1.0", "distill.temperature=1.0"]}
STAGES = {  # the stages run in two processes on two cores, then `all` collects (finished runs are reused)
    "all": "every run, then the JSON, Markdown and figure",
    "teacher": "the teacher and the fine-tunes only",
    "scratch": "the from-scratch runs only",
}
FINE_TUNE = ["model=source", "optim.lr=1e-3", "optim.warmup_steps=10"]


def point(summary: dict) -> dict:
    """Bits per byte and loss at T and 16T, and the loss by position bucket at 16T, from a run's summary."""
    T = summary["seq_len"]
    short, long = summary["eval"][str(T)], summary["eval"][str(LONG * T)]
    return {**metrics(short, long), "tokens": summary["tokens_seen"]}


def metrics(short: dict, long: dict) -> dict:
    """The bench's numbers from the evals at T (`short`) and 16T (`long`)."""
    by_position = {k.removeprefix("loss_pos_"): v for k, v in long.items() if k.startswith("loss_pos_")}
    return {
        "bpb@1x": short["bits_per_byte"],
        f"bpb@{LONG}x": long["bits_per_byte"],
        "loss@1x": short["loss"],
        f"loss@{LONG}x": long["loss"],
        "loss_by_position": by_position,
    }


def curve(folder: str, tokens_per_step: int) -> list[list[float]]:
    """[tokens seen, bits per byte at T] at each of the run's evals."""
    return [[step * tokens_per_step, value] for step, _, value in learning_curve(Path(folder), "bits_per_byte")]


def converted(teacher_dir: str, pattern: str) -> dict:
    """The bench's numbers of the teacher converted to `pattern`, before any training."""
    teacher, cfg, _ = load_run(teacher_dir)
    _, dataset = build(cfg, teacher_dir)
    model = convert(teacher, pattern, "P")
    graphdef, params = nnx.split(model)
    step = make_eval_step(graphdef)
    T = cfg.data.seq_len
    short, long = (evaluate(step, params, cfg, dataset, s * T) for s in (1, LONG))
    return {"layer_kinds": model.config.layer_kinds, **metrics(short, long)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher-steps", type=int, default=600)
    parser.add_argument("--fraction", type=float, default=0.1, help="fine-tuning tokens / the teacher's tokens")
    parser.add_argument("--evals", type=int, default=5, help="evals during each fine-tune and scratch run")
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS))
    stages = ", ".join(f"{k}: {v}" for k, v in STAGES.items())
    parser.add_argument("--stage", choices=STAGES, default="all", help=stages)
    parser.add_argument("--root", default="outputs/recovery")
    parser.add_argument("--out", default="results/recovery.json")
    args = parser.parse_args()
    check_int("--teacher-steps", args.teacher_steps)
    check_number("--fraction", args.fraction, low=0, high=1, open_low=True)
    check_int("--evals", args.evals)
    for pattern in args.patterns:
        check_pattern(pattern, 4)  # the teacher's 4 layers
    register_configs()
    steps = args.teacher_steps
    tune_steps = max(1, round(args.fraction * steps))
    tokens_per_step = BATCH * SEQ_LEN
    teacher_dir = os.path.join(args.root, "teacher")
    if args.stage == "scratch":
        for pattern in args.patterns:
            scratch_run(args.root, pattern, steps + tune_steps, args.evals)
        return
    teacher = point(train_once(teacher_dir, [*TEACHER, f"trainer.steps={steps}"]))
    teacher["train_loss"] = [[step, loss] for step, _, loss in train_loss_curve(Path(teacher_dir) / "tb")]
    print(f"teacher: {teacher['bpb@1x']:.4f} bpb at T", flush=True)
    record = {
        "recipe": {
            "teacher": [*TEACHER, f"trainer.steps={steps}"],
            "fine_tune": [*FINE_TUNE, f"trainer.steps={tune_steps}", "init_from=run:<teacher>", "init_convert=<P>"],
            "distill (KL)": DISTILL["KL"],
            "scratch": ["model.pattern=<pattern>", f"trainer.steps={steps + tune_steps}"],
            "tokens_per_step": tokens_per_step,
        },
        "teacher": teacher,
        "patterns": {},
    }
    for pattern in args.patterns:
        entry = {"converted": converted(teacher_dir, pattern), "fine_tuned": {}}
        every = [f"trainer.eval_every={max(1, tune_steps // args.evals)}"]
        for mode, more in DISTILL.items():
            folder = os.path.join(args.root, f"{pattern}_{mode}")
            tail = [f"init_from=run:{teacher_dir}", f"init_convert={pattern}", *more, *every]
            shared = [*conversion_loss.data_overrides(TEACHER), *FINE_TUNE, f"trainer.steps={tune_steps}"]
            summary = train_once(folder, [*shared, *tail])
            entry["fine_tuned"][mode] = {**point(summary), "curve": curve(folder, tokens_per_step)}
        if args.stage == "teacher":
            continue
        folder, summary = scratch_run(args.root, pattern, steps + tune_steps, args.evals)
        entry["scratch"] = {**point(summary), "curve": curve(folder, tokens_per_step)}
        record["patterns"][pattern] = entry
        print(json.dumps({pattern: {k: v for k, v in entry.items() if k != "curve"}}, default=str)[:400], flush=True)
    if args.stage == "teacher":
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    figure = plot(record, out.with_suffix(".png"))
    out.with_suffix(".md").write_text(report(record, figure))
    print(out.with_suffix(".md").read_text())


def scratch_run(root: str, pattern: str, steps: int, evals: int) -> tuple[str, dict]:
    """(folder, summary) of `pattern` trained from scratch with the teacher's sizes and recipe for `steps` steps."""
    folder = os.path.join(root, f"{pattern}_scratch")
    more = [f"model.pattern={pattern}", f"model.name={pattern}", f"trainer.steps={steps}"]
    return folder, train_once(folder, [*TEACHER, *more, f"trainer.eval_every={max(1, steps // evals)}"])


def recovered(converted_bpb: float, tuned_bpb: float, teacher_bpb: float) -> float:
    """The fraction of the conversion's loss in bits per byte that fine-tuning won back (1: the teacher's level)."""
    return (converted_bpb - tuned_bpb) / (converted_bpb - teacher_bpb)


def millions(n: int) -> str:
    """A token count in millions, three significant digits: 2.46M."""
    return f"{n / 1e6:.3g}M"


def report(record: dict, figure: str) -> str:
    """results/recovery.md: the table and its reading."""
    teacher = record["teacher"]
    t = teacher["bpb@1x"]
    rows = [["teacher (A)", "", f"{t:.3f}", f"{teacher[f'bpb@{LONG}x']:.3f}", "", millions(teacher["tokens"])]]
    for pattern, e in record["patterns"].items():
        c = e["converted"]
        rows.append([f"{pattern}: converted", "0", f"{c['bpb@1x']:.3f}", f"{c[f'bpb@{LONG}x']:.3f}", "0%", ""])
        for mode, r in e["fine_tuned"].items():
            share = f"{recovered(c['bpb@1x'], r['bpb@1x'], t):.0%}"
            row = [f"{pattern}: fine-tuned, {mode}", millions(r["tokens"]), f"{r['bpb@1x']:.3f}"]
            rows.append([*row, f"{r[f'bpb@{LONG}x']:.3f}", share, millions(teacher["tokens"] + r["tokens"])])
        s = e["scratch"]
        both = [f"{s['bpb@1x']:.3f}", f"{s[f'bpb@{LONG}x']:.3f}"]
        rows.append([f"{pattern}: from scratch", millions(s["tokens"]), *both, "", millions(s["tokens"])])
    header = ["model", "its training tokens", "bpb at T", f"bpb at {LONG}T", "gap won back", "total tokens"]
    recipe = "\n".join(f"- {k}: `{' '.join(v) if isinstance(v, list) else v}`" for k, v in record["recipe"].items())
    return (
        "# Recovery: converting a softmax LM to power retention\n\n"
        "`python -m experiments.recovery` (results/recovery.json). Bits per byte on held-out windows of the text task "
        f'at the training length T and at {LONG}T; "gap won back" is the share of the conversion\'s loss (converted '
        'minus teacher, at T) that fine-tuning recovered; "total tokens" counts the teacher\'s pretraining for the '
        "converted models, so each from-scratch run has the same total.\n\n"
        f"{md_table(header, rows)}\n\n{reading(record)}\n\n![recovery]({figure})\n\n## Recipe\n{recipe}\n"
    )


def reading(record: dict) -> str:
    """One line for the teacher (did its training loss still fall?) and one per pattern, from the numbers: the
    better fine-tune against the teacher and the from-scratch run, and whether that run was still learning."""
    teacher = record["teacher"]
    lines = []
    if teacher.get("train_loss"):
        steps = teacher["train_loss"][-1][0]
        window = lambda lo, hi: mean([loss for step, loss in teacher["train_loss"] if lo * steps < step <= hi * steps])
        half, end = window(0.4, 0.5), window(0.9, 1.0)
        lines.append(
            f"- The teacher's training loss (the mean of its logged values) was {half:.3f} at 40-50% of its "
            f"{steps} steps and {end:.3f} at 90-100%: {'still falling' if end < half - 0.02 else 'flat'}."
        )
    for pattern, e in record["patterns"].items():
        mode, best = min(e["fine_tuned"].items(), key=lambda item: item[1]["bpb@1x"])
        share = best["tokens"] / teacher["tokens"]
        gap = best["bpb@1x"] - teacher["bpb@1x"]
        scratch = e["scratch"]["bpb@1x"] - best["bpb@1x"]
        curve = e["scratch"]["curve"]
        fell = ""
        if len(curve) > 1:
            fell = f" (that run's held-out bpb fell by {curve[-2][1] - curve[-1][1]:.3f} over its last eval interval)"
        lines.append(
            f"- {pattern}: after {share:.0%} of the teacher's tokens the better fine-tune ({mode}) is "
            f"{abs(gap):.3f} bpb {'above' if gap > 0 else 'below'} the teacher at T "
            f"({recovered(e['converted']['bpb@1x'], best['bpb@1x'], teacher['bpb@1x']):.0%} of the conversion's loss "
            f"won back), and {abs(scratch):.3f} bpb {'better' if scratch > 0 else 'worse'} than {pattern} trained from "
            f"scratch on the same total tokens{fell}; at {LONG}T it is "
            f"{best[f'bpb@{LONG}x']:.3f} against the teacher's {teacher[f'bpb@{LONG}x']:.3f}."
        )
    return "\n".join(lines)


def plot(record: dict, path: Path) -> str:
    """Bits per byte at T against fine-tuning tokens (left), the from-scratch runs' learning curves against total
    tokens with the teacher and the fine-tuned models at theirs (middle), the loss by position at 16T (right)."""
    fig = Figure(figsize=(15, 4.2))
    left, middle, right = fig.subplots(1, 3)
    teacher = record["teacher"]
    for ax in (left, middle):
        ax.axhline(teacher["bpb@1x"], color="k", lw=1, label="teacher (A)")
    for i, (pattern, e) in enumerate(record["patterns"].items()):
        color = f"C{i}"
        start = [0, e["converted"]["bpb@1x"]]
        for mode, style in (("plain", "-"), ("KL", "--")):
            tuned = e["fine_tuned"][mode]
            left.plot(*zip(start, *tuned["curve"]), style, color=color, marker="o", ms=3, label=f"{pattern}, {mode}")
            total = teacher["tokens"] + tuned["tokens"]
            middle.plot([total], [tuned["bpb@1x"]], "o" if mode == "plain" else "s", color=color, mfc="none")
        left.axhline(e["scratch"]["bpb@1x"], color=color, ls=":", lw=1, label=f"{pattern} from scratch (same total)")
        middle.plot(*zip(*e["scratch"]["curve"]), ":", color=color, marker=".", label=f"{pattern} from scratch")
        best = min(e["fine_tuned"].values(), key=lambda r: r["bpb@1x"])
        right.plot(*by_position(best), color=color, marker="o", ms=3, label=f"{pattern} fine-tuned (best)")
        right.plot(*by_position(e["scratch"]), color=color, ls=":", label=f"{pattern} from scratch")
    right.plot(*by_position(teacher), color="k", marker="o", ms=3, label="teacher (A)")
    right.axvline(SEQ_LEN, color="gray", lw=0.8)
    left.set(xlabel="fine-tuning tokens", ylabel="bits per byte at T", title="recovery against fine-tuning tokens")
    middle.set(xlabel="total tokens", ylabel="bits per byte at T", title="from scratch (dotted) vs converted (marks)")
    right.set(xlabel="position in the window", ylabel="loss (nats)", title=f"loss by position at {LONG}T", xscale="log")
    middle.plot([teacher["tokens"]], [teacher["bpb@1x"]], "k*", ms=8)
    for ax in (left, middle):
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: millions(x)))
    for ax in (left, middle, right):
        ax.legend(fontsize=6)
    return save(fig, path)


def by_position(entry: dict) -> tuple[list[int], list[float]]:
    """(each bucket's upper position, its mean loss) of an entry's loss by position at 16T, from position 2 on."""
    buckets = sorted((int(k.split("_")[1]), v) for k, v in entry["loss_by_position"].items())
    return [hi for hi, _ in buckets if hi > 2], [v for hi, v in buckets if hi > 2]


if __name__ == "__main__":
    main()
