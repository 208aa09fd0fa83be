"""The comparison's presets: what `python -m experiments.compare.run --preset NAME` trains, evaluates and times.

A preset names trained configurations (`Entry`: a model config group and its overrides) in three roles:
`headline` (softmax A, window W, the window with the power state's bytes, power P, hybrids: on every task),
`ablations` (one change to a headline entry each) and `frontier` (windows, degrees, head dims, the registry's
other fixed-state mixers, quantized KV caches: on each frontier task, one per training length, evaluated at 1x-16x
of it). Each task gives its cell (model block, data, optimiser and trainer: the convergence rule, trainer.early_stop,
where a task trains until its eval stops improving), the learning rates every entry is trained at (seed
`seeds[0]`; a best lr at the grid's edge extends the grid, `lr_extensions`), the seeds run at the best one, and the
test lengths.
Each task's cell is a Hydra experiment file, configs/experiment/compare/<cell>.yaml: the preset's model
block and the task's data, optimiser and trainer settings, each recipe written once there (compare/recipe/: the cpu
preset's MQAR, passkey and text recipes, which the other cells change by key). One cell's model trains by hand at
its defaults with `python train.py experiment=compare/cpu_mqar model=power` (any model group); this file keeps only
the protocol: the entries and their model overrides, the cells, the lr grids, the seeds and the test lengths.

- `cpu`: this 2-core machine, about 2.3 hours on 2 idle cores in one call, or a named part a call (CPU_ESTIMATE).
- `cpu_budget`: the cpu preset's MQAR cells (far and near) at a 2,000-step cap for softmax, power and the
  registry's other fixed-state mixers: their learning curves (about an hour on 2 idle cores).
- `gpu_small`: one H200 in one call under 10 minutes: speed at 1k-64k, one short MQAR cell (GPU_SMALL_ESTIMATE).
- `gpu`: the full comparison on one H100/H200-class GPU (hours).
- `smoke`: seconds; the pipeline end to end at toy sizes (the tests run it).
- `demo`: `make demo`'s far cell and models (configs/experiment/mqar_demo.yaml, in compare/demo.yaml).
"""

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from retention.configs import CONFIG_DIR

# An Entry's state_format -> the format retention.serve.quantized_state takes (its STATE_FORMATS).
STATE_FORMAT_CODES = {"int8": 8, "int4": 4, "fp8": "fp8"}


@dataclass(frozen=True)
class Entry:
    """One compared configuration: `group` (configs/model/<group>.yaml) and model overrides after the
    preset's and the task's. `matched_window`: the window is the task's matched window (KV bytes = the power state's).
    `kv_cache_bits`: nothing is trained; `base`'s runs are evaluated decoding with that quantized KV cache.
    `state_format` (a key of STATE_FORMAT_CODES): nothing is trained; `base`'s runs are evaluated token by token
    with every recurrent state re-quantized per row after every token, as `generate(..., state_format=...)` does.
    `base` and `change` name what an ablation changes (the ablation table)."""

    group: str
    overrides: tuple[str, ...] = ()
    matched_window: bool = False
    kv_cache_bits: int | None = None
    state_format: str | None = None
    base: str | None = None
    change: str = ""

    def __post_init__(self):
        if self.state_format is not None and self.state_format not in STATE_FORMAT_CODES:
            raise ValueError(
                f"state_format must be None or one of {tuple(STATE_FORMAT_CODES)}, got {self.state_format!r}"
            )
        if self.state_format is not None and self.kv_cache_bits is not None:
            raise ValueError(
                f"an Entry quantizes its KV cache or its states, not both: got kv_cache_bits={self.kv_cache_bits}, "
                f"state_format={self.state_format!r}"
            )
        if not self.trained and self.base is None:
            raise ValueError("an Entry with kv_cache_bits or state_format evaluates a base's runs: base must be set")

    @property
    def trained(self) -> bool:
        return self.kv_cache_bits is None and self.state_format is None

    @property
    def state_code(self):
        """The state format as `retention.serve.quantized_state` takes it (8, 4 or "fp8"), or None."""
        return None if self.state_format is None else STATE_FORMAT_CODES[self.state_format]


@dataclass(frozen=True)
class Task:
    """One quality task on `data` (the data config group, whose metric and readers the protocol uses).
    `experiment`: its cell, the experiment config (configs/experiment/<experiment>.yaml) that sets that
    data group, the preset's model block, the optimiser (all but the lr) and the trainer, the same for every entry,
    so every entry sees the same tokens; `overrides`: Hydra overrides after it (none in the presets: a test's
    changes). The lr is chosen on the trainer's eval at 1x (`summary.json`, eval batches 0..); the test eval
    reports `test_scales` x seq_len and `long_lengths` on eval batches from TEST_OFFSET on (independent draws).
    `test_tokens`: tokens per test batch (batch = max(1, test_tokens // L)).
    A long length runs through prefill and decode steps of `long_chunk` tokens that carry every layer's cache (its
    memory that of one chunk, not of L) and draws batches past `test_batches` until its labelled targets (MQAR's
    queries) number at least `long_min_queries`.
    `skip`: entries this task leaves out.
    `lr_extensions`: how many steps (the grid's own ratio) an entry's grid extends beyond an edge where its best
    lr sits (protocol.py); 0: never."""

    data: str
    experiment: str
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    test_scales: tuple[int, ...] = (1, 16)
    long_lengths: tuple[int, ...] = ()
    test_batches: int = 4
    test_tokens: int = 16384
    decode_chunk: int = 256  # tokens per decode step in the quantized-cache eval
    long_chunk: int = 256  # tokens per decode step at the long lengths (a W layer attends to window + chunk slots)
    long_min_queries: int = 0  # labelled targets a long length reads at least (0: test_batches alone)
    skip: tuple[str, ...] = ()  # entries not run on this task (the report shows them as not run)
    lr_extensions: int = 1
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Speed:
    """The speed sweep: training-step time at each length with the same tokens per step, decode time after each
    context, for `models` (entry names)."""

    lengths: tuple[int, ...]
    tokens_per_step: int
    repeats: int
    decode_contexts: tuple[int, ...]
    decode_tokens: int
    models: tuple[str, ...]


@dataclass(frozen=True)
class Preset:
    """What one comparison measures; see the module docstring. `model`: the experiment config whose model block
    the speed sweep times (each task's experiment carries that block, or its change of it). `long_eval_bytes`: a
    long test eval runs only where XLA's estimate of its memory is below this (else "not run (memory)");
    `long_eval_skip`: entries left out of the
    long lengths (each with the reason). `seeded`: entries beyond the headline that get every seed of a task too
    (a finding on one seed that the report leans on)."""

    name: str
    model: str
    entries: dict[str, Entry]
    headline: tuple[str, ...]
    tasks: dict[str, Task]
    speed: Speed | None
    peak_flops: float
    ablations: tuple[str, ...] = ()
    frontier: tuple[str, ...] = ()
    ablation_task: str | None = None
    frontier_tasks: tuple[str, ...] = ()  # one per training length
    long_eval_bytes: float = 8 * 2**30
    long_eval_skip: dict[str, str] = field(default_factory=dict)
    seeded: tuple[str, ...] = ()

    def __post_init__(self):
        if unknown := [name for name in self.seeded if name not in self.entries]:
            raise ValueError(f"seeded must name entries of the preset ({sorted(self.entries)}), got {unknown[0]!r}")

    def task_entries(self, task: str) -> tuple[str, ...]:
        """The entries compared on `task`, headline first, each once (an untrained entry only with its base)."""
        names = [*self.headline]
        names += list(self.ablations) if task == self.ablation_task else []
        names += list(self.frontier) if task in self.frontier_tasks else []
        skip = self.tasks[task].skip
        left_out = lambda n: n in skip or (not self.entries[n].trained and self.entries[n].base in skip)
        return tuple(n for n in dict.fromkeys(names) if not left_out(n))


TEST_OFFSET = 1_000_000  # the test eval's first eval-split batch index: draws the trainer's eval never makes

HEADLINE_ENTRIES = {
    "softmax": Entry("softmax"),
    "swa": Entry("swa"),
    "swa_matched": Entry("swa", matched_window=True),
    "power": Entry("power"),
    "hybrid": Entry("hybrid", ("model.pattern=PA",)),  # 1:1, so a 2-layer model has both kinds
}


def ablation_entries() -> dict[str, Entry]:
    """One change each to a headline entry (the headline models have the preset's short convolution and QK
    RMSNorm: the ablations take one part away, or change the degree or the hybrid's ratio)."""
    return {
        "power_conv0": Entry("power", ("model.conv_size=0",), base="power", change="no short convolution"),
        "softmax_conv0": Entry("softmax", ("model.conv_size=0",), base="softmax", change="no short convolution"),
        "power_noqknorm": Entry("power", ("model.qk_norm=false",), base="power", change="no QK RMSNorm"),
        "power_nogate": Entry("power", ("model.gating=false",), base="power", change="no gating"),
        "power_deg4": Entry("power", ("model.deg=4",), base="power", change="degree 4 (not 2)"),
        "hybrid_3to1": Entry(
            "hybrid", ("model.pattern=PPPA", "model.n_layers=4"), base="hybrid", change="3:1 (PPPA, 4 layers), not 1:1"
        ),
    }


# The registry's other fixed-state mixers (retention/nn/registry.py), each at the preset's shared sizes: frontier
# entries on every frontier task. One line each: a new mixer joins the frontier here.
FIXED_STATE_ENTRIES = {
    "gated_deltanet": Entry("gated_deltanet"),
    "gla": Entry("gla"),
    "mamba2": Entry("mamba2"),
}


def quantized_state_entries() -> dict[str, Entry]:
    """The fixed-state entries of the frontier (power and the registry's other fixed-state mixers) decoded with
    their states stored int8 and fp8 e4m3 (a scale per state row), beside softmax's quantized KV caches.

    Returns:
        {"<base>_state_<format>": Entry}: nothing trained, each evaluating its base's runs.
    """
    bases = {"power": HEADLINE_ENTRIES["power"], **FIXED_STATE_ENTRIES}
    return {
        f"{name}_state_{fmt}": Entry(base.group, state_format=fmt, base=name, change=f"{fmt} state")
        for name, base in bases.items()
        for fmt in ("int8", "fp8")
    }


def frontier_entries(windows: tuple[int, ...], head_dims: tuple[int, ...], degrees=(2, 4)) -> dict[str, Entry]:
    """Windows, power at `degrees` and other head dims, the other fixed-state mixers, softmax decoding from an
    int8 / 4-bit cache, and the fixed states decoding from int8 / fp8 states."""
    out = {f"swa_w{w}": Entry("swa", (f"model.window={w}",)) for w in windows}
    for d in head_dims:
        if 2 in degrees:
            out[f"power_d{d}"] = Entry("power", (f"model.head_dim={d}",))
        if 4 in degrees:
            out[f"power_deg4_d{d}"] = Entry("power", (f"model.head_dim={d}", "model.deg=4"))
    out.update(FIXED_STATE_ENTRIES)
    for bits in (8, 4):
        out[f"softmax_kv{bits}"] = Entry("softmax", kv_cache_bits=bits, base="softmax", change=f"{bits}-bit KV cache")
    out.update(quantized_state_entries())
    return out


def _entries(windows, head_dims, degrees=(2, 4)) -> dict[str, Entry]:
    return {**HEADLINE_ENTRIES, **ablation_entries(), **frontier_entries(windows, head_dims, degrees)}


def _frontier(windows, head_dims, degrees=(2, 4)) -> tuple[str, ...]:
    return tuple(frontier_entries(windows, head_dims, degrees)) + ("power_deg4", "hybrid_3to1")


FRONTIER_SCALES = (1, 2, 4, 8, 16)  # a frontier task's test lengths, as multiples of its training length

CPU_WINDOWS, CPU_HEAD_DIMS = (64,), (8,)  # and degree 2 only: degree 4 at the headline's d=16 is a frontier entry
CPU_ABLATIONS = ("softmax_conv0", "power_conv0", "hybrid_3to1")  # those that can change the reading on the far cell
CPU_FRONTIER = _frontier(CPU_WINDOWS, CPU_HEAD_DIMS, (2,))
CPU_LRS = (3e-3, 1e-2, 3e-2)  # 1e-2 is the best of 1e-3..1e-2 for every model on this cell: the grid goes past it
# MQAR's 64k point: at least 512 queries a run (4 a sequence: 128 sequences of 65,536 tokens, 8.4M tokens), decoded
# in steps of 256 tokens that carry the state. The preset's P and W models read a 64k sequence there in about 1.0
# and 1.25 CPU seconds (measured 2026-12-04 through the eval on random models, 2 and 4 sequences; the batch does not
# change the rate), so 125-165 CPU seconds a run and about 23 CPU minutes for the 9 runs at 64k (W, matched W and
# P, 3 seeds each); softmax and the hybrid are left out (their A layers' cost grows with L^2: long_eval_skip).
CPU_LONG_QUERIES = 512
CPU = Preset(
    name="cpu",
    model="compare/cpu_model",
    entries=_entries(CPU_WINDOWS, CPU_HEAD_DIMS, (2,)),
    headline=tuple(HEADLINE_ENTRIES),
    ablations=CPU_ABLATIONS,
    frontier=CPU_FRONTIER,
    ablation_task="mqar",
    frontier_tasks=("mqar", "mqar_t128"),
    seeded=("power_deg4",),  # degree 4 recalled best past T in seed 0: whether it does in every seed
    tasks={
        # The demo's far cell: the matched window (the power state's bytes at d=16, about 70 tokens) reaches every
        # key at T=64. Three seeds on this task only (the headline's recall cell); every run trains until the rule
        # stops it.
        "mqar": Task(
            "mqar",
            "compare/cpu_mqar",
            lrs=CPU_LRS,
            seeds=(0, 1, 2),
            test_scales=FRONTIER_SCALES,
            long_lengths=(65536,),
            long_min_queries=CPU_LONG_QUERIES,
            test_batches=2,
            test_tokens=65536,
        ),
        # The frontier's second training length, the same tokens a step; the fixed-state, window and softmax
        # entries only; three seeds for the headline's (softmax, P), one for the others.
        "mqar_t128": Task(
            "mqar",
            "compare/cpu_mqar_t128",
            lrs=CPU_LRS,
            seeds=(0, 1, 2),
            skip=("swa", "swa_matched", "hybrid", "hybrid_3to1", "power_deg4"),
            test_scales=FRONTIER_SCALES,
            test_batches=2,
            test_tokens=65536,
        ),
        "passkey": Task(
            "passkey",
            "compare/cpu_passkey",
            lrs=CPU_LRS,
            seeds=(0,),
            skip=("swa",),  # W: on MQAR only
            test_scales=(1, 16),
            long_lengths=(65536,),
            test_batches=2,
            test_tokens=65536,
        ),
        "text": Task(
            "text",
            "compare/cpu_text",
            lrs=(1e-3, 3e-3, 1e-2),
            seeds=(0,),
            skip=("swa",),  # W: on MQAR only
            test_scales=(1, 16),
            test_tokens=16384,
        ),
    },
    speed=Speed(
        lengths=(1024, 65536),
        tokens_per_step=65536,
        repeats=1,
        decode_contexts=(1024, 65536),
        decode_tokens=16,
        models=("softmax", "power", "hybrid"),
    ),
    peak_flops=3.24e11,  # measured matmul rate of the 2-core dev machine (PERF_LOG.md)
    long_eval_bytes=6 * 2**30,
    long_eval_skip={
        "softmax": "time: about 1e12 FLOPs a 64k sequence, minutes on 2 cores",
        "hybrid": "time: its A layer decodes a 64k sequence in about 70 CPU seconds; MQAR's 512 queries at 64k are "
        "128 sequences, 2.5 CPU hours a run",
        **{e: "time: the cpu preset evaluates 64k for the headline only" for e in (*CPU_ABLATIONS, *CPU_FRONTIER)},
    },
)
# Measured on the 2 idle cores (2026-12-05, experiments/PERF_LOG.md "the cpu preset's time"): each task is a
# named part that finishes in one call (`--only task=...`), text 7 minutes, passkey 10.5, mqar_t128 40, mqar 78,
# the speed sweep 7; `python -m experiments.compare.estimate --preset cpu [--only ...]` times a call from the
# committed records.
CPU_ESTIMATE = "about 2.3 hours on 2 idle cores in one call, or parts of 7 to 78 minutes (one a task)"

GPU_WINDOWS, GPU_HEAD_DIMS = (64, 256, 2048), (16, 64)
GPU_LRS = (3e-4, 1e-3, 3e-3)
GPU_MQAR_TEST = {"test_scales": FRONTIER_SCALES, "test_tokens": 262144}
GPU = Preset(
    name="gpu",
    model="compare/gpu_model",
    entries=_entries(GPU_WINDOWS, GPU_HEAD_DIMS),
    headline=tuple(HEADLINE_ENTRIES),
    ablations=tuple(ablation_entries()),
    frontier=_frontier(GPU_WINDOWS, GPU_HEAD_DIMS),
    ablation_task="mqar",
    frontier_tasks=("mqar", "mqar_8k"),
    tasks={
        # Zoology's depth for recall (2 layers) and the matched window's reach: compare/recipe/gpu_recall.yaml.
        "mqar": Task("mqar", "compare/gpu_mqar", lrs=GPU_LRS, seeds=(0, 1, 2), **GPU_MQAR_TEST),
        # The frontier's second training length: the same cell at T=8192, the same tokens a step.
        "mqar_8k": Task(
            "mqar",
            "compare/gpu_mqar_8k",
            lrs=GPU_LRS,
            seeds=(0,),
            skip=("swa", "swa_matched", "hybrid", "hybrid_3to1", "power_deg4"),
            **GPU_MQAR_TEST,
        ),
        "passkey": Task(
            "passkey",
            "compare/gpu_passkey",
            lrs=GPU_LRS,
            seeds=(0, 1, 2),
            test_scales=(1, 16),
            test_tokens=262144,
        ),
        "text": Task(
            "text",
            "compare/gpu_text",
            lrs=(3e-4, 1e-3, 3e-3),
            seeds=(0, 1, 2),
            test_scales=(1, 16),
            test_tokens=262144,
        ),
    },
    speed=Speed(
        lengths=(1024, 4096, 16384, 65536),
        tokens_per_step=262144,
        repeats=5,
        decode_contexts=(1024, 4096, 16384, 65536),
        decode_tokens=128,
        models=tuple(HEADLINE_ENTRIES),
    ),
    peak_flops=989e12,  # H100/H200 dense bf16
    long_eval_bytes=100 * 2**30,
)

GPU_SMALL = Preset(
    name="gpu_small",
    model="compare/gpu_small_model",  # 4 layers: compilation dominates a 10-minute call
    entries=HEADLINE_ENTRIES,
    headline=("softmax", "swa_matched", "power", "hybrid"),
    tasks={
        "mqar": Task(
            "mqar",
            "compare/gpu_small_mqar",
            lrs=(1e-3,),
            seeds=(0,),
            test_scales=(1, 16),
            test_batches=2,
            test_tokens=262144,
        ),
    },
    speed=Speed(
        lengths=(1024, 4096, 16384, 65536),
        tokens_per_step=131072,  # the power step's XLA estimate at 262,144 was about 100 GiB: over JAX's 75% default
        repeats=3,
        decode_contexts=(1024, 65536),
        decode_tokens=64,
        models=("softmax", "power", "hybrid"),
    ),
    peak_flops=989e12,
    long_eval_bytes=100 * 2**30,
)
# FLOPs (retention/nn/sizing.py flops_per_token, training = 3x forward): the 4-layer ~30M models run about 2e8
# FLOPs a token outside attention; softmax at 64k adds 4 layers x 3 x 2 x 65536 x 512 = 8e8. 262,144 tokens a step
# is at most 2.6e14 FLOPs, 0.7 s at 40% of 989 TFLOP/s: 12 timed shapes x 4 steps take under a minute; decode is
# ms. The MQAR cell: 600 steps x 65,536 tokens x (6 x 8M + attention) ~ 3e15 FLOPs, about 10 s per model, 4
# models. Compilation dominates: 12 train steps, 6 decode loops, 4 training runs and their evals, 30-40 programs of
# roughly 5-15 s each: 5-8 minutes in all. Run it with a 600 s timeout; the speed half alone is --skip-quality.
GPU_SMALL_ESTIMATE = "about 6-8 minutes on one H200, mostly compilation (30-40 programs)"

SMOKE_TEST = {"test_batches": 1, "test_tokens": 256, "decode_chunk": 16}
SMOKE = Preset(
    name="smoke",
    model="compare/smoke_model",
    entries={
        **{k: HEADLINE_ENTRIES[k] for k in ("softmax", "swa_matched", "power")},
        "power_nogate": ablation_entries()["power_nogate"],
        "softmax_kv4": frontier_entries((), ())["softmax_kv4"],
        "power_state_fp8": quantized_state_entries()["power_state_fp8"],
        "mamba2": FIXED_STATE_ENTRIES["mamba2"],
    },
    headline=("softmax", "swa_matched", "power"),
    ablations=("power_nogate",),
    frontier=("softmax_kv4", "power_state_fp8", "mamba2"),  # a quantized state and a registry mixer, end to end
    ablation_task="mqar",
    frontier_tasks=("mqar", "mqar_t32"),
    tasks={
        "mqar": Task(
            "mqar",
            "compare/smoke_mqar",
            lrs=(1e-3, 1e-2),
            seeds=(0, 1),
            test_scales=(1, 4),
            long_lengths=(1024,),
            long_min_queries=8,  # 4 a sequence: 2 sequences, one more than test_batches
            **SMOKE_TEST,
        ),
        "mqar_t32": Task(  # the frontier's second training length
            "mqar",
            "compare/smoke_mqar_t32",
            lrs=(1e-3, 1e-2),
            seeds=(0,),
            skip=("swa_matched", "mamba2"),
            test_scales=(1, 4),
            **SMOKE_TEST,
        ),
    },
    speed=Speed(
        lengths=(64, 256),
        tokens_per_step=512,
        repeats=1,
        decode_contexts=(64, 256),
        decode_tokens=4,
        models=("softmax", "power"),
    ),
    peak_flops=3.24e11,
    long_eval_skip={"softmax": "time (a test of the marking)"},
)

# The field's fixed-state mixers at a budget that lets them learn: the cpu preset's MQAR cells (the far one and the
# near one, min_gap 0) with a 2,000-step cap and the rule never before step 1,000. At the cpu preset's 600-step cap
# the cosine schedule has decayed before Gated DeltaNet, GLA and Mamba2 leave the plateau (they start to recall at
# about step 300 of a 1,200-step schedule on the near cell, and not within 400 steps of a 400-step one:
# results/convergence_notes.md section 5). One lr (1e-2, the cpu sweep's best for P and A) and one seed: a
# learning-curve study, not a tuned comparison.
BUDGET_TASK = dict(lrs=(1e-2,), seeds=(0,), lr_extensions=0, test_scales=(1, 4), test_batches=2, test_tokens=16384)
BUDGET = Preset(
    name="cpu_budget",
    model=CPU.model,
    entries={"softmax": HEADLINE_ENTRIES["softmax"], "power": HEADLINE_ENTRIES["power"], **FIXED_STATE_ENTRIES},
    headline=("softmax", "power", *FIXED_STATE_ENTRIES),
    tasks={
        "mqar": Task("mqar", "compare/cpu_budget_mqar", **BUDGET_TASK),
        "mqar_near": Task("mqar", "compare/cpu_budget_mqar_near", **BUDGET_TASK),
    },
    speed=None,
    peak_flops=CPU.peak_flops,
)

# The recipe study: each mixer's positional encoding and decay init, chosen on evidence (docs/DESIGN.md section 3,
# the recipe table; results/compare/recipes/NOTES.md). Every entry is the cpu preset's model (2 layers, 4 heads of
# 16, conv 4, QK-norm, about 100k parameters) with one recipe choice, trained on the far cell with value-id filler
# (no key id between a pair and its query: the clean cell) and with the whole-vocabulary filler (Zoology's and the
# cpu preset's: about half of the filler are key ids, which a delta rule stores as pairs), 3 seeds each, to a
# 1,000-step cap (the cpu preset's 600 stops D, G and M as they start to climb: cpu_budget) under the convergence
# rule; softmax without RoPE, power at degree 4 and the window once, on the clean cell. Entries run in this order.
RECIPE_ENTRIES = {
    "power": Entry("power"),  # no RoPE (the recipe)
    "power_rope": Entry("power", ("model.layers.P.rope_base=10000.0",), base="power", change="RoPE"),
    # the same two with the lr held after warm-up (no cosine decay), on the committed far cell
    "power_const": Entry("power", ("optim.min_lr_ratio=1.0",), base="power", change="constant lr"),
    "power_rope_const": Entry(
        "power",
        ("model.layers.P.rope_base=10000.0", "optim.min_lr_ratio=1.0"),
        base="power",
        change="RoPE, constant lr",
    ),
    **{
        f"{name}{suffix}": Entry(name, (f"model.decay_init={init}",), base=name, change=f"decay_init={init}")
        for name in FIXED_STATE_ENTRIES
        for suffix, init in (("_long", "long"), ("", "paper"))
    },
    "softmax": Entry("softmax"),  # RoPE (the recipe)
    "softmax_norope": Entry("softmax", ("model.rope_base=null",), base="softmax", change="no RoPE"),
    "power_deg4": Entry("power", ("model.deg=4",), base="power", change="degree 4"),
    "swa": Entry("swa", base="softmax", change="a 19-token window"),
}
RECIPE_TASK = dict(lrs=(1e-2,), seeds=(0, 1, 2), lr_extensions=0, test_scales=(1, 4), test_batches=2)
RECIPES = Preset(
    name="recipes",
    model=CPU.model,
    entries=RECIPE_ENTRIES,
    headline=tuple(RECIPE_ENTRIES)[:11],
    ablations=tuple(RECIPE_ENTRIES)[11:],
    ablation_task="mqar_nokeys",
    tasks={
        "mqar_nokeys": Task(
            "mqar",
            "compare/recipes_mqar_nokeys",
            **RECIPE_TASK,
            skip=("power_const", "power_rope_const"),
        ),
        "mqar": Task("mqar", "compare/cpu_mqar", **RECIPE_TASK),
    },
    speed=None,
    peak_flops=CPU.peak_flops,
)

DEMO_YAML = Path(CONFIG_DIR) / "experiment" / "mqar_demo.yaml"
# The demo as a preset: `make demo`'s far cell and models (compare/demo.yaml: the demo's experiment file, the cell
# written there only), so the comparison's protocol (lr sweep, seeds, test eval, report) runs on exactly the demo's
# runs, at the demo's lr.
DEMO = Preset(
    name="demo",
    model="compare/demo",
    entries={k: HEADLINE_ENTRIES[k] for k in ("softmax", "swa", "power", "hybrid")},
    headline=("softmax", "swa", "power", "hybrid"),
    tasks={
        "mqar": Task(
            "mqar",
            "compare/demo",
            lrs=(float(OmegaConf.load(DEMO_YAML).optim.lr),),
            seeds=(0,),
            test_scales=(1, 4),
            test_tokens=8192,
        ),
    },
    speed=None,
    peak_flops=3.24e11,
)

# Quality at 64k (issue 39): every compared mixer trained on whole long documents (data=long_text: the standard
# library's files of 64 KiB or more, bytes, the eval split's 25 files never trained on) at T = 2048 for about one
# epoch of the training split (600 steps of 8 x 2048 = 9.8M of its 11.3M tokens), then read from each eval
# document's start to 65,536 tokens by `python -m experiments.long_context text <its runs' folders>` (loss by
# position). The cpu preset's model; each mixer's recipe (docs/DESIGN.md section 3). Not yet run: at the 2-core
# machine's 1.3-1.5k tokens/s for a 0.8M-parameter model at T = 2048 (PERF_LOG) a run of this 0.1M one takes
# tens of minutes, the preset many hours; it is sized for a lent GPU or several resumed calls.
LONG_ENTRIES = {
    **{k: HEADLINE_ENTRIES[k] for k in ("softmax", "swa_matched", "power", "hybrid")},
    **{k: ablation_entries()[k] for k in ("power_deg4", "hybrid_3to1")},
    **FIXED_STATE_ENTRIES,
}
LONG = Preset(
    name="long",
    model=CPU.model,
    entries=LONG_ENTRIES,
    headline=tuple(LONG_ENTRIES),
    tasks={"text_long": Task("long_text", "compare/long_text", lrs=(3e-3, 1e-2), seeds=(0, 1, 2), test_scales=(1,))},
    speed=None,
    peak_flops=CPU.peak_flops,
)

# The long preset at this CPU's size, a first reach to 64k: seven mixers (A, W at the P state's bytes, P, the PA
# hybrid, D, G, M), three seeds, one lr (1e-2: what the cpu preset's text sweep chose, a 60-step smoke sweep at
# T = 256, so weak evidence; one lr for want of CPU time), 500 steps of 4 x 2048 (4.1M tokens, a third of an epoch
# of the training split). Not converged: it measures how each model's loss moves with position to 65,536 after the
# same short training, and how much seeds move it, not the models' final quality; its notes say so.
LONG_CPU_ENTRIES = {
    k: LONG_ENTRIES[k] for k in ("softmax", "swa_matched", "power", "hybrid", "gated_deltanet", "gla", "mamba2")
}
LONG_CPU = Preset(
    name="long_cpu",
    model=CPU.model,
    entries=LONG_CPU_ENTRIES,
    headline=tuple(LONG_CPU_ENTRIES),
    tasks={
        "text_long": Task(
            "long_text", "compare/long_cpu_text", lrs=(1e-2,), seeds=(0, 1, 2), test_scales=(1,), lr_extensions=0
        )
    },
    speed=None,
    peak_flops=CPU.peak_flops,
)

# Training at long context (issue 39, item 3): each fixed-state kind (P, D, G, M) trained directly at T = 16,384 on
# the same data, tokens and schedule as long_cpu's T = 2,048 runs (one sequence a step: 250 steps of 16,384 = the
# same 4.1M tokens; 25 warm-up steps = the same 410k warm-up tokens), to read beside them at 64k. Softmax is not
# trained here (its step at 16k is measured by the speed stage, beside the fixed states' at 2k and 16k with the
# same tokens a step).
LONG_CPU_16K_ENTRIES = {k: LONG_ENTRIES[k] for k in ("softmax", "power", "gated_deltanet", "gla", "mamba2")}
LONG_CPU_16K = Preset(
    name="long_cpu_16k",
    model=CPU.model,
    entries=LONG_CPU_16K_ENTRIES,
    headline=tuple(LONG_CPU_16K_ENTRIES),
    tasks={
        "text_long": Task(
            "long_text",
            "compare/long_cpu_16k_text",
            lrs=(1e-2,),
            seeds=(0,),
            test_scales=(1,),
            lr_extensions=0,
            skip=("softmax",),
        )
    },
    speed=Speed(
        lengths=(2048, 16384),
        tokens_per_step=16384,
        repeats=3,
        decode_contexts=(16384,),
        decode_tokens=16,
        models=tuple(LONG_CPU_16K_ENTRIES),
    ),
    peak_flops=CPU.peak_flops,
)

PRESETS = {p.name: p for p in (CPU, BUDGET, RECIPES, LONG, LONG_CPU, LONG_CPU_16K, GPU_SMALL, GPU, SMOKE, DEMO)}
