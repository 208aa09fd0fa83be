"""Runs that finish learning: a run's held-out learning curve (the trainer's periodic eval, trainer.eval_every)
from its TensorBoard log, and the convergence rule (retention/train/convergence.py, the one the trainer's
trainer.early_stop applies) with the steps where the curve crossed fractions of its final value.

    python -m experiments.compare.convergence RUN_DIR [RUN_DIR ...] --patience 4
"""

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from retention.train.convergence import convergence

EVAL_TAG = "eval/x1/{metric}"  # the trainer's eval at the training length (retention/train/loop.py)
TOKENS_SEEN_TAG = "train/tokens_seen"  # tokens seen at each logged step


def learning_curve(run_dir: Path, metric: str = "accuracy") -> list[tuple[int, int | None, float]]:
    """(step, tokens seen, value) of a run's held-out eval at the training length, from its TensorBoard log: the
    eval tag by step, the tokens from train/tokens_seen at that step (None where not logged). TensorBoard's purge
    of "orphaned" events is off: the tokens-indexed twins' large steps would make a resumed run's later events
    look out of order and drop them."""
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    acc.Reload()
    tags = acc.Tags()["scalars"]
    tag = EVAL_TAG.format(metric=metric)
    if tag not in tags:
        return []
    tokens = {e.step: int(e.value) for e in acc.Scalars(TOKENS_SEEN_TAG)} if TOKENS_SEEN_TAG in tags else {}
    by_step = {e.step: e.value for e in acc.Scalars(tag)}  # a resumed run's repeated step: its latest value
    return [(step, tokens.get(step), value) for step, value in sorted(by_step.items())]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--patience", type=int, default=4)
    parser.add_argument("--min-delta", type=float, default=0.005)
    parser.add_argument("--min-step", type=int, default=0)
    parser.add_argument("--metric", default="accuracy")
    args = parser.parse_args(argv)
    for run_dir in args.run_dirs:
        curve = learning_curve(run_dir, args.metric)
        if not curve:
            print(json.dumps({"run": str(run_dir), "curve": []}))
            continue
        steps, tokens, values = zip(*curve)
        rule = convergence(list(steps), list(values), args.patience, args.min_delta, args.min_step)
        print(json.dumps({"run": str(run_dir), **asdict(rule), "curve": [list(c) for c in curve]}))


if __name__ == "__main__":
    main()
