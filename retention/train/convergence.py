"""The convergence rule: a run has converged at the first eval (at or after `min_step`) after which its held-out
metric has not improved (by more than `min_delta`) for `patience` evals in a row; a run that reaches its cap
(trainer.steps) first has not converged. Without `min_step` the rule stops a run on MQAR's early plateau
(tests/experiments/test_convergence.py), before the jump that recall makes. The crossing steps (the first eval at
0.5 and 0.9 of the final value) tell a run still climbing ("not yet") from one settled on a plateau.

The trainer applies the rule with `trainer.early_stop` (`EvalHistory`: the rule's metric at each eval, kept in
every checkpoint so a resumed run counts its patience on); experiments/compare/convergence.py applies it to a
finished run's TensorBoard curve.
"""

from dataclasses import dataclass

from retention.validation import check_int, check_number

# The rule's metric per task when trainer.early_stop.metric is None, and the metrics where lower is better.
DEFAULT_METRIC = {"mqar": "accuracy", "passkey": "accuracy", "copy": "accuracy", "text": "loss"}
LOWER_IS_BETTER = ("loss", "bits_per_byte")
METRIC_CHOICES = ("accuracy", "exact_match", *LOWER_IS_BETTER)
FRACTIONS = (0.5, 0.9)


@dataclass(frozen=True)
class Convergence:
    """What the rule says of one curve: `converged_step` (None: it never stopped improving before its last eval),
    the best value and its step, the final value, and {fraction: first step at fraction x final}."""

    converged_step: int | None
    best: float
    best_step: int
    final: float
    crossings: dict[float, int | None]


def stopping_index(values: list[float], patience: int, min_delta: float = 0.0, first: int = 0) -> int | None:
    """The index of the eval at which the rule stops: the first i >= `first` with no value in (i - patience, i]
    above the best before them by more than min_delta; None when the curve never does (higher is better).
    `first` keeps the rule off an early plateau (MQAR sits at 1/pairs a while before recall arrives, as a jump)."""
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


def crossing_steps(
    steps: list[int], values: list[float], fractions=FRACTIONS, higher_is_better: bool = True
) -> dict[float, int | None]:
    """{fraction: the first step whose value is at least fraction x the final value} (None where the final value
    is not positive). Lower is better (a loss): the first step at most final / fraction."""
    final = values[-1]
    if final <= 0:
        return dict.fromkeys(fractions)
    reached = (lambda v, f: v >= f * final) if higher_is_better else (lambda v, f: v <= final / f)
    return {f: next((s for s, v in zip(steps, values) if reached(v, f)), None) for f in fractions}


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


class EvalHistory:
    """One run's held-out metric at each eval (step, value) and the rule on it. `patience` 0: the rule is off
    (the run trains to its cap); `saved`: a checkpoint's `record()`, so a resumed run continues the count."""

    def __init__(self, metric: str, patience: int, min_delta: float, min_step: int, saved: dict | None = None):
        self.metric, self.patience, self.min_delta, self.min_step = metric, patience, min_delta, min_step
        self.higher_is_better = metric not in LOWER_IS_BETTER
        history = (saved or {}).get("eval_history") or {}
        same = history.get("metric") == metric  # a resume that changes the metric starts its history afresh
        self.points = [(int(s), float(v)) for s, v in history.get("points", [])] if same else []

    def add(self, step: int, value: float) -> None:
        """Record the metric at `step` (an eval at a step already recorded replaces it)."""
        self.points = [p for p in self.points if p[0] != step] + [(step, float(value))]

    def stopped_step(self) -> int | None:
        """The step at which the rule stops the run, or None (rule off, or not yet)."""
        if not self.patience or not self.points:
            return None
        steps, values = zip(*self.points)
        signed = [v if self.higher_is_better else -v for v in values]
        first = next((i for i, s in enumerate(steps) if s >= self.min_step), len(steps))
        stop = stopping_index(signed, self.patience, self.min_delta, first)
        return None if stop is None else steps[stop]

    def record(self) -> dict:
        """What a checkpoint keeps (restored by `saved`)."""
        return {"eval_history": {"metric": self.metric, "points": [list(p) for p in self.points]}}

    def summary(self, cap: int) -> dict:
        """The summary's account: why the run stopped, at which step, the rule, the curve and its crossings."""
        stopped = self.stopped_step()
        steps, values = zip(*self.points) if self.points else ((), ())
        crossings = crossing_steps(steps, values, higher_is_better=self.higher_is_better) if values else {}
        return {
            "stop_reason": "converged" if stopped is not None else "steps",  # "steps": it reached trainer.steps
            "stopped_at": stopped if stopped is not None else cap,
            "steps_cap": cap,
            "rule": {
                "metric": self.metric,
                "patience": self.patience,
                "min_delta": self.min_delta,
                "min_step": self.min_step,
            },
            "crossings": {str(f): s for f, s in crossings.items()},
            "eval_curve": [list(p) for p in self.points],
        }
