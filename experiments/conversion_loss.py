"""The held-out loss of a trained softmax LM right after conversion (`retention.nn.convert`), before any
fine-tuning: how close each pattern and each initialisation of the new parameters starts to the teacher.

The teacher: 4 layers of full attention (GQA 4:2, head dim 16, d_model 64, no convolution or QK-norm, like a
Llama block), trained with `python train.py` on the text task (the standard library's .py files, byte tokens,
T=128) for --steps steps. Each variant converts it and is evaluated on the teacher's held-out windows
(trainer.eval_batches batches at T and 4T).

    python -m experiments.conversion_loss              # teacher in outputs/conversion_loss/teacher (reused)
    python -m experiments.conversion_loss --only "PA, bias 2"     # a few variants, merged into the JSON
    python -m experiments.conversion_loss --fine-tune 100         # FINE_TUNES: PA trained 100 steps, +- distillation
Writes results/conversion_loss.json and prints the table.
"""

import argparse
import json
import os

from flax import nnx

from experiments.hydra_run import train_once
from retention import load_run
from retention.nn import convert
from retention.train.config import build, register_configs
from retention.train.evaluate import evaluate
from retention.train.step import make_eval_step

TEACHER = [
    "model=softmax",
    "model.name=teacher",
    "model.target_params=null",
    "model.n_layers=4",
    "model.d_model=64",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.head_dim=16",
    "model.conv_size=0",
    "model.qk_norm=false",
    "data=text",
    "data.tokenizer=bytes",
    "data.seq_len=128",
    "data.batch_size=16",
    "optim.lr=3e-3",
    "trainer.eval_batches=8",
    "trainer.eval_scales=[1,4]",
    "trainer.progress=false",
]
# name -> (pattern or layers, mixer settings)
VARIANTS = {
    "A (the teacher)": ("A", {}),
    "PA (bias 2)": ("PA", {}),
    "PA, bias 4": ("PA", {"gate_bias_init": 4.0}),
    "PA, bias 0": ("PA", {"gate_bias_init": 0.0}),
    "PA, bias 8": ("PA", {"gate_bias_init": 8.0}),
    "PA, no gate": ("PA", {"gating": False}),
    "PPPA (bias 2)": ("PPPA", {}),
    "PPPA, bias 4": ("PPPA", {"gate_bias_init": 4.0}),
    "PPPA, bias 0": ("PPPA", {"gate_bias_init": 0.0}),
    "PPPA, bias 8": ("PPPA", {"gate_bias_init": 8.0}),
    "PPPA, no gate": ("PPPA", {"gating": False}),
    "P (bias 2)": ("P", {}),
    "P, bias 4": ("P", {"gate_bias_init": 4.0}),
    "P, bias 0": ("P", {"gate_bias_init": 0.0}),
    "P, bias 8": ("P", {"gate_bias_init": 8.0}),
    "P, no gate": ("P", {"gating": False}),
    "P, conv 4 (identity)": ("P", {"conv_size": 4}),
    "WWWA, window 32": ("WWWA", {"window": 32}),
    "DDDA": ("DDDA", {}),
    "GGGA": ("GGGA", {}),
}


def data_overrides(teacher: list[str]) -> list[str]:
    """A teacher's overrides that are not the model's: the data, optimiser and trainer settings its fine-tunes share."""
    return [o for o in teacher if not o.startswith("model")]


def teacher_run(root: str, steps: int) -> str:
    """The teacher's run folder, trained unless its summary.json is there."""
    folder = os.path.join(root, "teacher")
    train_once(folder, [*TEACHER, f"trainer.steps={steps}"])
    return folder


FINE_TUNES = {  # name -> (init_convert, more overrides): fine-tuned with --fine-tune steps
    "PA": ("PA", []),
    "PA, KL": ("PA", ["distill.kl_weight=1.0", "distill.temperature=1.0"]),
    "PA, KL + layers": ("PA", ["distill.kl_weight=1.0", "distill.layer_weight=1.0"]),
}


def fine_tune(root: str, teacher: str, name: str, steps: int) -> dict:
    """A fine-tune of the converted teacher (init_from, lr 1e-3, 10 warmup steps; reused when finished): its
    summary's held-out loss at T and 4T and its first training loss."""
    pattern, more = FINE_TUNES[name]
    folder = os.path.join(root, "fine_tune", name.replace(" ", "").replace(",", "_").replace("+", "_"))
    base = [*data_overrides(TEACHER), "model=source", "optim.lr=1e-3"]
    tail = ["optim.warmup_steps=10", f"init_from=run:{teacher}", f"init_convert={pattern}", *more]
    summary = train_once(folder, [*base, f"trainer.steps={steps}", *tail])
    T = summary["seq_len"]
    loss = {f"loss@{s}T": summary["eval"][str(s * T)]["loss"] for s in (1, 4)}
    return {"steps": steps, **loss, "first_train_loss": summary["initial_loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--root", default="outputs/conversion_loss")
    parser.add_argument("--out", default="results/conversion_loss.json")
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), help="these variants (merged into --out)")
    parser.add_argument("--fine-tune", type=int, default=0, help="fine-tune FINE_TUNES for this many steps")
    args = parser.parse_args()
    register_configs()
    folder = teacher_run(args.root, args.steps)
    teacher, cfg, _ = load_run(folder)
    _, dataset = build(cfg, folder)
    results = {}
    saved = {}
    if (args.only or args.fine_tune) and os.path.exists(args.out):
        with open(args.out) as f:
            saved = json.load(f)
        results = saved["variants"]
    for name in args.only or ([] if args.fine_tune else list(VARIANTS)):  # --fine-tune alone: only the fine-tunes
        pattern, settings = VARIANTS[name]
        model = convert(teacher, pattern, **settings)
        graphdef, params = nnx.split(model)
        step = make_eval_step(graphdef)
        results[name] = {
            "layer_kinds": model.config.layer_kinds,
            **{f"loss@{s}T": evaluate(step, params, cfg, dataset, s * cfg.data.seq_len)["loss"] for s in (1, 4)},
        }
        print(f"| {name} | {results[name]['loss@1T']:.4f} | {results[name]['loss@4T']:.4f} |", flush=True)
    tuned = {name: fine_tune(args.root, folder, name, args.fine_tune) for name in FINE_TUNES if args.fine_tune}
    for name, r in tuned.items():
        print(f"| {name}, {r['steps']} steps | {r['loss@1T']:.4f} | {r['loss@4T']:.4f} |", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        variants = {name: results[name] for name in VARIANTS if name in results}  # in VARIANTS' order
        tuned = {**saved.get("fine_tuned", {}), **tuned}
        record = {"teacher": TEACHER + [f"trainer.steps={args.steps}"], "variants": variants, "fine_tuned": tuned}
        json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
