"""Runs that finish learning: a run's held-out learning curve (the trainer's periodic eval, trainer.eval_every),
the convergence rule and the steps where the curve crossed fractions of its final value.

The rule: a run has converged at the first eval (at or after `min_step`) after which its metric has not improved
(by more than `min_delta`) for `patience` evals in a row; a run that reaches its cap (trainer.steps) first has
not converged. Without `min_step` the rule stops a run on MQAR's early plateau (tests/experiments/
test_convergence.py), before the jump that recall makes.
The crossing steps (0.5 and 0.9 of the final value, higher is better) tell a run that is still climbing ("not
yet") from one that has settled on a plateau.

    python -m experiments.compare.convergence RUN_DIR [RUN_DIR ...] --patience 4
"""

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from retention.validation import check_int, check_number

EVAL_TAG = "eval/x1/{metric}"  # the trainer's eval at the training length (retention/train/loop.py)
TOKENS_SEEN_TAG = "train/tokens_seen"  # tokens seen at each logged step


@dataclass(frozen=True)
class Convergence:
    """What the rule says of one curve: `converged_step` (None: it never stopped improving before its last eval),
    the best value and its step, the final value, and {fraction: first step at or above fraction x final}."""

    converged_step: int | None
    best: float
    best_step: int
    final: float
    crossings: dict[float, int | None]


def stopping_index(values: list[float], patience: int, min_delta: float = 0.0, first: int = 0) -> int | None:
    """The index of the eval at which the rule stops: the first i >= `first` with no value in (i - patience, i]
    above the best before them by more than min_delta; None when the curve never does. `first` keeps the rule off
    an early plateau (MQAR sits at 1/pairs for a while before recall arrives, as a jump)."""
    check_int("patience", patience)
    check_int("first", first, low=0)
    check_number("min_delta", min_delta, low=0)
    best, best_i = float("-inf"), -1
    for i, value in enumerate(values):
        if value > best + min_delta:
            best, best_i = value, i
        elif i - best_i >= patience and i >= first:
            return i
    return None


def crossing_steps(steps: list[int], values: list[float], fractions=(0.5, 0.9)) -> dict[float, int | None]:
    """{fraction: the first step whose value is at least fraction x the final value} (None where the final value
    is not positive)."""
    final = values[-1]
    return {
        f: next((s for s, v in zip(steps, values) if v >= f * final), None) if final > 0 else None for f in fractions
    }


def convergence(
    steps: list[int], values: list[float], patience: int, min_delta: float = 0.0, min_step: int = 0
) -> Convergence:
    """The rule (never before `min_step`) and the crossing steps of one curve (steps ascending, one value each,
    higher is better)."""
    if not steps or len(steps) != len(values):
        raise ValueError(f"steps and values must be equally long and non-empty, got {len(steps)} and {len(values)}")
    stop = stopping_index(values, patience, min_delta, first=next((i for i, s in enumerate(steps) if s >= min_step), 0))
    best_i = max(range(len(values)), key=lambda i: (values[i], -i))
    return Convergence(
        converged_step=None if stop is None else steps[stop],
        best=values[best_i],
        best_step=steps[best_i],
        final=values[-1],
        crossings=crossing_steps(steps, values),
    )


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
