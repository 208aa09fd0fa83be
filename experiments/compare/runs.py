"""What the comparison reads back from the trainer, in one place: a run folder's files, each task's metric in
summary.json's eval entries (`summary["eval"][<length>][<metric>]`), loss by position, TensorBoard's training
loss, a finished run's parameters, and the eval sums of one batch. When the trainer's keys or tags change (the
trainer issue: eval tags `eval/x{scale}/{metric}`, new summary keys; the data issue: bits per byte, loss by
position), this file is what adapts.
"""

import contextlib
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from flax import nnx
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from retention import load_run
from retention.train.step import masked_sums

SUMMARY = "summary.json"  # the trainer's, per run
TEST = "test.json"  # the test eval's {length: metrics or {"skipped": reason}}
RECORD = "compare.json"  # the harness's: the run's task, entry, lr, seed, overrides, command, training and test seconds
CONFIG = "config.yaml"  # the resolved trainer config
TRAIN_LOSS_TAG = "train/loss"
# Loss by position at one eval length: keys such as "loss_by_position/1024" (the bucket's first position).
POSITION_KEY = re.compile(r"^(?:loss_by_position|position_loss|loss_pos)[/_](\d+)(?:[-_]\d+)?$")


@dataclass(frozen=True)
class Metric:
    """A task's reported metric: the first of `keys` an eval entry holds, and whether higher is better."""

    keys: tuple[str, ...]
    higher_is_better: bool
    labels: tuple[str, ...]

    def value(self, evals: dict) -> float | None:
        """The metric in one eval entry ({name: value}), or None if it has none of the keys."""
        return next((float(evals[k]) for k in self.keys if k in evals), None)

    def label(self, evals: dict) -> str:
        """What the value is, for a table header."""
        return next((lab for k, lab in zip(self.keys, self.labels) if k in evals), self.labels[-1])


METRICS = {
    "mqar": Metric(("accuracy",), True, ("accuracy",)),
    "passkey": Metric(("exact_match",), True, ("exact match",)),
    "copy": Metric(("accuracy",), True, ("accuracy",)),
    "text": Metric(("bits_per_byte", "loss"), False, ("bits per byte", "loss (nats per token)")),
    "long_text": Metric(("bits_per_byte", "loss"), False, ("bits per byte", "loss (nats per token)")),
}


def read_json(path: Path) -> dict | None:
    """The JSON at `path`, or None when there is none."""
    return json.loads(path.read_text()) if path.exists() else None


def write_json(path: Path, value) -> None:
    """Write `value` as JSON (non-finite floats as null), through a temporary file so a reader never sees half."""
    clean = lambda x: (
        {k: clean(v) for k, v in x.items()}
        if isinstance(x, dict)
        else [clean(v) for v in x]
        if isinstance(x, (list, tuple))
        else None
        if isinstance(x, float) and not math.isfinite(x)
        else x
    )
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(clean(value), indent=2))
    tmp.replace(path)


def selection_value(summary: dict, task: str) -> float:
    """The task's metric on the trainer's eval at the training length (NaN when the run diverged)."""
    value = METRICS[task].value(summary["eval"][str(summary["seq_len"])])
    return math.nan if value is None else value


def position_losses(evals: dict) -> dict[int, float]:
    """{first position of a bucket: mean loss there} from one eval entry (empty when it has none)."""
    out = {}
    for key, value in evals.items():
        match = POSITION_KEY.match(key)
        if match:
            out[int(match.group(1))] = float(value)
        elif isinstance(value, dict) and key in ("loss_by_position", "position_loss"):
            out.update({int(k): float(v) for k, v in value.items()})
    return dict(sorted(out.items()))


def train_loss_curve(tb_dir: Path) -> list[tuple[int, float, float]]:
    """(step, seconds since the run's first event, loss) of the run's training loss in TensorBoard; none when the
    run's folder is not on this machine."""
    if not tb_dir.is_dir():
        return []
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    if TRAIN_LOSS_TAG not in tags:
        return []
    start = min(e.wall_time for tag in tags for e in acc.Scalars(tag))
    return [(e.step, e.wall_time - start, e.value) for e in acc.Scalars(TRAIN_LOSS_TAG)]


def load_params(run_dir: Path, step: int):
    """The trained parameters (the model's nnx.State) of the run in `run_dir` at checkpoint `step` (the finished
    run's trainer.steps), read by `retention.load_run`."""
    model = load_run(str(run_dir), step).model
    return nnx.state(model)


def eval_sums(model, inputs_BT, targets_BT) -> dict:
    """The trainer's masked sums (nll, correct, labels, exact, rows) of one batch through the full forward."""
    return masked_sums(model(inputs_BT), targets_BT)


TIMINGS = "timings.json"  # <runs>/timings.json: seconds and job counts of each stage, summed over calls


@contextlib.contextmanager
def timed(runs: Path, stage: str, jobs: int):
    """Add the block's wall and CPU seconds (all threads) and `jobs` to `stage` in <runs>/timings.json, so a
    preset's time can be estimated from what its parts took (experiments/compare/estimate.py)."""
    start, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        path = runs / TIMINGS
        runs.mkdir(parents=True, exist_ok=True)
        all_stages = read_json(path) or {}
        old = all_stages.get(stage, {"jobs": 0, "wall_s": 0.0, "cpu_s": 0.0})
        wall, used = time.perf_counter() - start, time.process_time() - cpu
        all_stages[stage] = {"jobs": old["jobs"] + jobs, "wall_s": old["wall_s"] + wall, "cpu_s": old["cpu_s"] + used}
        write_json(path, all_stages)
