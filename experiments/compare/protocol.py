"""The protocol (Zoology's, adapted): which runs a preset makes, in which order, how the learning rate is chosen, and
the statistics the report shows.

Stages, each resumable (a run with its summary.json, or its test.json, is never redone):
1. "sweep": every trained entry of every task at each of the task's learning rates, seed `seeds[0]`;
   "extend": where an entry's best learning rate sits at its grid's edge, one more rate beyond that edge (the
   grid's own ratio), up to the task's `lr_extensions` steps; the report flags a best still at the edge;
2. "seeds": a headline (or `seeded`) entry's other seeds at its best learning rate, once its sweep is complete;
3. "test": every run at the best learning rate evaluated on the test draws; a quantized-cache entry evaluates its
   base's runs there.
The best learning rate maximises the task's metric (minimises a loss) on the trainer's eval at 1x, the eval split's
batches 0..eval_batches-1 (summary.json); ties go to the smaller rate. The reported numbers are the test eval's
(eval-split batches from TEST_OFFSET on: draws the selection never saw). `--part k/n` runs every n-th job of each
stage, so parts run side by side or one after another; `--only task=mqar,entry=power` (or `seed=1,2`) filters.
A grid of one rate and no extensions has nothing to choose, so its other seeds need not wait for the first.
"""

import statistics
from dataclasses import dataclass
from pathlib import Path

from experiments.compare.presets import Preset


@dataclass(frozen=True)
class Run:
    """One training run (or, for a quantized-cache entry, one evaluation of its base's run)."""

    task: str
    entry: str
    lr: float
    seed: int

    def folder(self, runs: Path) -> Path:
        """Where the run writes: <runs>/<task>/<entry>/lr<lr>/seed<seed>/."""
        return runs / self.task / self.entry / f"lr{self.lr:g}" / f"seed{self.seed}"

    def fields(self) -> dict:
        return {"task": self.task, "entry": self.entry, "lr": self.lr, "seed": self.seed}


def sweep_runs(preset: Preset) -> list[Run]:
    """Stage 1: every trained entry of every task at each learning rate, with the task's first seed."""
    return [
        Run(task, entry, lr, spec.seeds[0])
        for task, spec in preset.tasks.items()
        for entry in preset.task_entries(task)
        if preset.entries[entry].trained
        for lr in spec.lrs
    ]


def seeds_of(preset: Preset, task: str, entry: str) -> tuple[int, ...]:
    """The seeds reported for `entry` on `task`: all the task's for headline and `seeded` entries, the first for
    the others."""
    seeds = preset.tasks[task].seeds
    return seeds if entry in preset.headline or entry in preset.seeded else seeds[:1]


def trained_entry(preset: Preset, entry: str) -> str:
    """The entry whose runs `entry` reports: itself, or its base for a quantized-cache entry."""
    spec = preset.entries[entry]
    return entry if spec.trained else spec.base


def best_lr(values: dict[float, float | None], higher_is_better: bool) -> float | None:
    """The learning rate with the best selection value; None while any is missing. Non-finite values (a run that
    diverged) lose; ties go to the smaller rate. A grid of one rate is its choice at once, finished or not: there is
    nothing to choose, so the seeds of such a grid need not wait for the first (nor a report for its runs)."""
    if len(values) == 1:
        return next(iter(values))
    if not values or any(v is None for v in values.values()):
        return None
    finite = lambda v: v == v and abs(v) != float("inf")
    sign = 1 if higher_is_better else -1
    return min(values, key=lambda lr: (not finite(values[lr]), -sign * values[lr] if finite(values[lr]) else 0, lr))


def round_lr(lr: float) -> float:
    """A learning rate to two significant digits (what a run folder's name shows)."""
    return float(f"{lr:.2g}")


def lr_grid(lrs: tuple[float, ...], value, higher_is_better: bool, extensions: int) -> tuple[float, ...]:
    """An entry's learning rates: the task's `lrs` (ascending), then, while the best of them (by `value(lr)`: the
    selection value, None while that run is unfinished) sits at an edge of the grid, one more rate beyond that
    edge at the grid's ratio there, at most `extensions` times; the grid stops growing at an unfinished run."""
    grid = sorted(lrs)
    for _ in range(extensions if len(grid) > 1 else 0):
        best = best_lr({lr: value(lr) for lr in grid}, higher_is_better)
        if best == grid[-1]:
            grid.append(round_lr(grid[-1] ** 2 / grid[-2]))
        elif best == grid[0]:
            grid.insert(0, round_lr(grid[0] ** 2 / grid[1]))
        else:  # interior, or pending
            break
    return tuple(grid)


def at_edge(grid: tuple[float, ...], best: float | None) -> bool:
    """Whether the best learning rate sits at an edge of a grid of two or more (the optimum may lie beyond)."""
    return len(grid) > 1 and best in (grid[0], grid[-1])


def mean_range(values: list[float]) -> tuple[float, float, float]:
    """(mean, min, max) of the seeds' values."""
    return statistics.fmean(values), min(values), max(values)


def in_part(index: int, part: tuple[int, int]) -> bool:
    """Whether job `index` of a stage belongs to part k of n (1-based): every n-th job, so parts mix tasks."""
    k, n = part
    return index % n == k - 1


def parse_part(text: str) -> tuple[int, int]:
    """ "k/n" -> (k, n) with 1 <= k <= n."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--part must be k/n with integers 1 <= k <= n, got {text!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"--part must be k/n with integers 1 <= k <= n, got {text!r}")
    return k, n


FILTER_KEYS = ("task", "entry", "stage", "seed")


def parse_only(items: list[str]) -> dict[str, set[str]]:
    """["task=mqar,passkey", "entry=power"] -> {"task": {"mqar", "passkey"}, "entry": {"power"}}: comma-separated
    key=value pairs, a bare value adding to the key before it; several --only flags combine."""
    out: dict[str, set[str]] = {}
    for item in items:
        key = None
        for part in item.split(","):
            name, sep, value = part.partition("=")
            if sep:
                key = name
            else:
                value = part
            if key not in FILTER_KEYS or not value:
                raise ValueError(f"--only takes key=value[,value] with keys {FILTER_KEYS}, got {item!r}")
            out.setdefault(key, set()).add(value)
    return out


STAGE_NAMES = ("sweep", "extend", "seeds", "test")  # in the order a call runs them (quality.STAGES)


def check_only(preset: Preset, only: dict[str, set[str]]) -> None:
    """Refuse an --only value that names none of the preset's tasks, entries, stages or seeds (it would select
    nothing, silently).

    Raises:
        ValueError: naming the key, the value and what the preset allows.
    """
    allowed = {
        "task": set(preset.tasks),
        "entry": set(preset.entries),
        "stage": set(STAGE_NAMES),
        "seed": {str(seed) for spec in preset.tasks.values() for seed in spec.seeds},
    }
    for key, values in only.items():
        for value in sorted(values - allowed[key]):
            raise ValueError(f"--only {key}={value}: the {preset.name} preset has {key} in {sorted(allowed[key])}")


def selected(only: dict[str, set[str]], stage: str, run: Run) -> bool:
    """Whether `run`, a job of `stage`, passes the --only filter (`parse_only`: its task, entry, stage and seed)."""
    fields = {"stage": stage, "task": run.task, "entry": run.entry, "seed": str(run.seed)}
    return all(fields[key] in values for key, values in only.items())
