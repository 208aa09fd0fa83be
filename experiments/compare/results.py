"""The comparison's numbers from quality.json (quality.collect): each entry's best learning rate, its seeds' test
values at each length, their mean and range, and what a cell says when a run is missing, skipped or pending. The
report's tables and plots read only this.
"""

import dataclasses
import math
from dataclasses import dataclass

from experiments.compare.protocol import best_lr, mean_range
from experiments.compare.runs import METRICS, selection_value
from retention.nn.config import LMConfig
from retention.nn.registry import MIXERS


@dataclass(frozen=True)
class Cell:
    """A table cell: the seeds' values (mean, min, max, count), or a note ("not run (memory: ...)", "pending")."""

    mean: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    n: int = 0
    note: str = ""

    @property
    def below(self) -> float:
        """mean - min, never negative (the error bar below the mean)."""
        return max(0.0, self.mean - self.lo)

    @property
    def above(self) -> float:
        """max - mean, never negative."""
        return max(0.0, self.hi - self.mean)

    def text(self, digits: int = 3) -> str:
        """ "0.812 (0.790-0.840)" over several seeds, "0.812" for one, else the note."""
        if self.n == 0:
            return self.note or "pending"
        value = f"{self.mean:.{digits}f}"
        return value if self.n == 1 else f"{value} ({self.lo:.{digits}f}-{self.hi:.{digits}f})"


class Results:
    """quality.json's runs, indexed by (task, entry, lr, seed)."""

    def __init__(self, quality: dict):
        self.quality = quality
        self.tasks, self.entries, self.roles = quality["tasks"], quality["entries"], quality["roles"]
        self.runs = {(r["task"], r["entry"], r["lr"], r["seed"]): r for r in quality["runs"]}

    def quantized(self, entry: str) -> bool:
        """Whether `entry` is its base's runs read through a quantized KV cache or quantized states.

        Args:
            entry: an entry of quality.json (one from before quantized states has no state_format).

        Returns:
            True when nothing of the entry's own is trained.
        """
        spec = self.entries[entry]
        return spec["kv_cache_bits"] is not None or spec.get("state_format") is not None

    def trained(self, entry: str) -> str:
        """The entry whose training runs `entry` reports (a quantized-cache or quantized-state entry's base)."""
        return self.entries[entry]["base"] if self.quantized(entry) else entry

    def metric(self, task: str):
        return METRICS[self.tasks[task]["data"]]

    def lrs(self, task: str, entry: str) -> list[float]:
        """The entry's learning rates: the task's grid with the extensions its best asked for."""
        t = self.tasks[task]
        return t.get("entry_lrs", {}).get(self.trained(entry), t["lrs"])

    def sweep(self, task: str, entry: str) -> dict[float, float | None]:
        """{lr: selection value (trainer eval at 1x) of the first seed's run, None where not finished}."""
        seed = self.tasks[task]["seeds"][0]
        out = {}
        for lr in self.lrs(task, entry):
            run = self.runs.get((task, self.trained(entry), lr, seed))
            summary = run and run["summary"]
            out[lr] = None if summary is None else selection_value(summary, self.tasks[task]["data"])
        return out

    def best_lr(self, task: str, entry: str) -> float | None:
        return best_lr(self.sweep(task, entry), self.metric(task).higher_is_better)

    def best_runs(self, task: str, entry: str) -> list[dict]:
        """The entry's runs at its best lr (each seed it reports), only those present in quality.json."""
        lr = self.best_lr(task, entry)
        return [r for (t, e, r_lr, _), r in self.runs.items() if (t, e, r_lr) == (task, entry, lr)]

    def summary(self, task: str, entry: str) -> dict | None:
        """A finished summary of the entry's training on `task` (its layers and parameters), if any."""
        runs = [r for (t, e, _, _), r in self.runs.items() if (t, e) == (task, self.trained(entry)) and r["summary"]]
        return runs[0]["summary"] if runs else None

    def layer_kinds(self, task: str, entry: str) -> str:
        s = self.summary(task, entry)
        return s["layer_kinds"] if s else "?"

    def layers(self, task: str, entry: str) -> str:
        """The entry's layers and their recipe as the report names a model: "PA, P: no RoPE, degree 2 / A: RoPE"
        (`recipe_text` of a finished run's resolved model), or the layers alone where no run kept its model."""
        runs = [r for (t, e, _, _), r in self.runs.items() if (t, e) == (task, self.trained(entry)) and r["summary"]]
        kinds = runs[0]["summary"]["layer_kinds"] if runs else "?"
        model = next((r["model"] for r in runs if r.get("model")), None)
        return f"{kinds}, {recipe_text(model, kinds)}" if model else kinds

    def evaluated_once(self, task: str) -> bool:
        """Whether every finished run of `task` that kept its held-out curve (summary.eval_curve) was evaluated at
        most once: a smoke test's budget, too short to show learning, which the report tables but does not draw.

        Args:
            task: a task of quality.json.

        Returns:
            False when no run of the task kept a held-out curve (nothing says it was a smoke test).
        """
        curves = [
            r["summary"]["eval_curve"]
            for (t, *_), r in self.runs.items()
            if t == task and r["summary"] and "eval_curve" in r["summary"]
        ]
        return bool(curves) and all(len(c) <= 1 for c in curves)

    def test_lengths(self, task: str) -> list[int]:
        """Every length any test eval of the task holds, sorted."""
        return sorted({int(L) for (t, *_), r in self.runs.items() if t == task and r["test"] for L in r["test"]})

    def cell(self, task: str, entry: str, length: int) -> Cell:
        """The test metric at `length` over the entry's seeds at its best lr (a note when skipped or pending)."""
        if entry not in self.tasks[task].get("entries", [entry]):
            return Cell(note="not run on this task")
        if self.best_lr(task, entry) is None:
            return Cell(note="pending (lr sweep)")
        metric, values, notes = self.metric(task), [], set()
        for run in self.best_runs(task, entry):
            if run["test"] is None:
                continue
            result = run["test"].get(str(length), {"skipped": "-"})  # a length this entry is not evaluated at
            if "skipped" in result:
                notes.add(result["skipped"])
            elif (value := metric.value(result)) is not None:
                values.append(value)
        if not values:
            return Cell(note="; ".join(sorted(notes)) or "pending")
        return Cell(*mean_range(values), n=len(values))

    def cache_bytes(self, task: str, entry: str, length: int | None = None) -> int:
        """The entry's decode-cache bytes for one sequence at `length` (None: the task's training length; other
        lengths: a frontier task's test lengths)."""
        if length is None:
            return self.tasks[task]["cache_bytes"][entry]
        return self.tasks[task]["cache_bytes_by_length"][entry][str(length)]

    def frontier_tasks(self) -> list[str]:
        """The tasks the frontier is read on, one per training length."""
        return self.roles.get("frontier_tasks", [])


def recipe_text(model: dict, kinds: str) -> str:
    """`config_recipe_text` of a run's resolved model section.

    Args:
        model: a run's resolved model section (quality.json's run `model`); without `layers` (made before per-layer
            settings) every layer is on the globals.
        kinds: the layer letters of the model (each kind named once, in order).

    Returns:
        The kinds' recipes, joined by " / ".
    """
    fields = {f.name for f in dataclasses.fields(LMConfig)}
    settings = {"layers": {}, **{k: v for k, v in model.items() if k in fields and k != "vocab_size"}}
    return config_recipe_text(LMConfig(**settings, vocab_size=256), kinds)


def config_recipe_text(config: LMConfig, kinds: str) -> str:
    """Each kind's recipe fields (the registry's `recipe`) as its layers are built (`LMConfig.for_kind`): "no RoPE,
    degree 2" for one kind, "P: no RoPE, degree 2 / A: RoPE" for several.

    Args:
        config: the model's LMConfig.
        kinds: the layer letters of the model (each kind named once, in order).

    Returns:
        The kinds' recipes, joined by " / ".
    """
    parts = []
    for letter in dict.fromkeys(kinds):
        kind = config.for_kind(letter)
        words = [RECIPE_WORDS[name](getattr(kind, name)) for name in MIXERS[letter].recipe]
        parts.append(f"{letter}: {', '.join(words)}" if len(set(kinds)) > 1 else ", ".join(words))
    return " / ".join(parts)


RECIPE_WORDS = {  # how a recipe field's value reads in a report
    "rope_base": lambda base: "no RoPE" if base is None else "RoPE",
    "deg": lambda deg: f"degree {deg}",
    "decay_init": lambda init: f"{init} decay init",
}
