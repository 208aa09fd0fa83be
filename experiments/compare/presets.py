"""The comparison's presets: what `python -m experiments.compare.run --preset NAME` trains, evaluates and times.

A preset names trained configurations (`Entry`: a model config group and its overrides) in three roles:
`headline` (softmax A, window W, the window with the power state's bytes, power P, hybrids: on every task),
`ablations` (one change to a headline entry each) and `frontier` (windows, degrees, head dims, quantized KV caches:
on the frontier task). Each task gives its data and trainer overrides, the learning rates every entry is trained
at (seed `seeds[0]`), the seeds run at the best one, and the lengths of the test evaluation. Model overrides are
Hydra strings, exactly as `train.py` takes them; each task's recipe is written once (MQAR_RECIPE, PASSKEY_RECIPE,
TEXT_RECIPE: the cpu preset's) and the other presets change it by key (`with_overrides`).

- `cpu`: this 2-core machine, about 30 minutes on 2 idle cores (CPU_ESTIMATE), in parts that resume.
- `gpu_small`: one H200 in one call under 10 minutes: speed at 1k-64k, one short MQAR cell (GPU_SMALL_ESTIMATE).
- `gpu`: the full comparison on one H100/H200-class GPU (hours).
- `smoke`: seconds; the pipeline end to end at toy sizes (the tests run it).
- `demo`: `make demo`'s far cell and models (retention/configs/experiment/mqar_demo.yaml, read from there).
"""

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from retention.configs import CONFIG_DIR


@dataclass(frozen=True)
class Entry:
    """One compared configuration: `group` (retention/configs/model/<group>.yaml) and model overrides after the
    preset's and the task's. `matched_window`: the window is the task's matched window (KV bytes = the power state's).
    `kv_cache_bits`: nothing is trained; `base`'s runs are evaluated decoding with that quantized KV cache.
    `base` and `change` name what an ablation changes (the ablation table)."""

    group: str
    overrides: tuple[str, ...] = ()
    matched_window: bool = False
    kv_cache_bits: int | None = None
    base: str | None = None
    change: str = ""

    @property
    def trained(self) -> bool:
        return self.kv_cache_bits is None


@dataclass(frozen=True)
class Task:
    """One quality task. `overrides`: data, optimiser (all but the lr) and trainer overrides, the same for every
    entry, so every entry sees the same tokens. The lr is chosen on the trainer's eval at 1x (`summary.json`, eval
    batches 0..); the test eval reports `test_scales` x seq_len and `long_lengths` on eval batches from
    TEST_OFFSET on (independent draws). `test_tokens`: tokens per test batch (batch = max(1, test_tokens // L)).
    `models`: extra model overrides per entry name ("*": all); `skip`: headline entries this task leaves out."""

    data: str
    overrides: tuple[str, ...]
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    test_scales: tuple[int, ...] = (1, 16)
    long_lengths: tuple[int, ...] = ()
    test_batches: int = 4
    test_tokens: int = 16384
    decode_chunk: int = 256  # tokens per decode step in the quantized-cache eval
    models: dict[str, tuple[str, ...]] = field(default_factory=dict)
    skip: tuple[str, ...] = ()  # headline entries not run on this task (the report shows them as not run)

    def model_overrides(self, entry: str) -> tuple[str, ...]:
        """This task's extra overrides of `entry`'s model config."""
        return (*self.models.get("*", ()), *self.models.get(entry, ()))


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
    """What one comparison measures; see the module docstring. `long_eval_bytes`: a long test eval runs only where
    XLA's estimate of its memory is below this (else "not run (memory)"); `long_eval_skip`: entries left out of the
    long lengths (each with the reason)."""

    name: str
    model: tuple[str, ...]
    entries: dict[str, Entry]
    headline: tuple[str, ...]
    tasks: dict[str, Task]
    speed: Speed | None
    peak_flops: float
    ablations: tuple[str, ...] = ()
    frontier: tuple[str, ...] = ()
    ablation_task: str | None = None
    frontier_task: str | None = None
    long_eval_bytes: float = 8 * 2**30
    long_eval_skip: dict[str, str] = field(default_factory=dict)

    def task_entries(self, task: str) -> tuple[str, ...]:
        """The entries compared on `task`, headline first, each once."""
        names = [n for n in self.headline if n not in self.tasks[task].skip]
        names += list(self.ablations) if task == self.ablation_task else []
        names += list(self.frontier) if task == self.frontier_task else []
        return tuple(dict.fromkeys(names))


def with_overrides(base: tuple[str, ...], *changes: str) -> tuple[str, ...]:
    """`base` (Hydra override strings) with each of `changes` applied by key: "key=value" replaces the base's
    entry of that key in place (or is appended when the base has none), "~key" removes it."""
    out = list(base)
    for change in changes:
        key = change.removeprefix("~").split("=", 1)[0]
        at = next((i for i, o in enumerate(out) if o.split("=", 1)[0] == key), None)
        if change.startswith("~"):
            if at is None:
                raise ValueError(f"changes: {change!r} removes {key!r}, which the base does not set")
            del out[at]
        elif at is None:
            out.append(change)
        else:
            out[at] = change
    return tuple(out)


TEST_OFFSET = 1_000_000  # the test eval's first eval-split batch index: draws the trainer's eval never makes
QUALITY_TRAINER = ("trainer.ckpt_every=100000", "trainer.keep=1", "trainer.progress=false")

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


def frontier_entries(windows: tuple[int, ...], head_dims: tuple[int, ...], degrees=(2, 4)) -> dict[str, Entry]:
    """Windows, power at `degrees` and other head dims, and softmax decoding from an int8 / 4-bit cache."""
    out = {f"swa_w{w}": Entry("swa", (f"model.window={w}",)) for w in windows}
    for d in head_dims:
        if 2 in degrees:
            out[f"power_d{d}"] = Entry("power", (f"model.head_dim={d}",))
        if 4 in degrees:
            out[f"power_deg4_d{d}"] = Entry("power", (f"model.head_dim={d}", "model.deg=4"))
    for bits in (8, 4):
        out[f"softmax_kv{bits}"] = Entry("softmax", kv_cache_bits=bits, base="softmax", change=f"{bits}-bit KV cache")
    return out


def _entries(windows, head_dims, degrees=(2, 4)) -> dict[str, Entry]:
    return {**HEADLINE_ENTRIES, **ablation_entries(), **frontier_entries(windows, head_dims, degrees)}


def _frontier(windows, head_dims, degrees=(2, 4)) -> tuple[str, ...]:
    return tuple(frontier_entries(windows, head_dims, degrees)) + ("power_deg4", "hybrid_3to1")


# Each task's recipe, once: the cpu preset's; the other presets change it by key (with_overrides).
MQAR_RECIPE = (
    "data.seq_len=64",
    "data.num_kv_pairs=4",
    "data.vocab_size=128",
    "data.min_gap=48",
    "data.batch_size=64",
    "optim.weight_decay=0",
    "optim.warmup_steps=20",
    "trainer.steps=200",
    "trainer.log_every=50",
    "trainer.eval_batches=4",
    "trainer.eval_scales=[1]",  # selection only: the test eval gives the longer lengths
    *QUALITY_TRAINER,
)
PASSKEY_RECIPE = (
    "data.seq_len=512",
    "data.batch_size=4",
    "optim.warmup_steps=10",
    "trainer.steps=60",
    "trainer.log_every=10",
    "trainer.eval_batches=2",
    "trainer.eval_scales=[1]",  # selection only: the test eval gives the longer lengths
    *QUALITY_TRAINER,
)
TEXT_RECIPE = (
    "data.seq_len=256",
    "data.batch_size=8",
    "optim.warmup_steps=10",
    "trainer.steps=60",
    "trainer.log_every=10",
    "trainer.eval_batches=2",
    "trainer.eval_scales=[1,4,16]",  # loss by position at 1x, 4x and 16x
    *QUALITY_TRAINER,
)

CPU_WINDOWS, CPU_HEAD_DIMS = (64,), (16,)  # and degree 2 only: degree 4 at d=8 is an ablation
CPU_ABLATIONS, CPU_FRONTIER = tuple(ablation_entries()), _frontier(CPU_WINDOWS, CPU_HEAD_DIMS, (2,))
CPU = Preset(
    name="cpu",
    model=(
        "model.n_layers=2",
        "model.n_heads=4",
        "model.n_kv_heads=4",
        "model.head_dim=8",
        "model.window=16",
        "model.conv_size=4",
        "model.qk_norm=true",
        "model.target_params=100000",
    ),
    entries=_entries(CPU_WINDOWS, CPU_HEAD_DIMS, (2,)),
    headline=tuple(HEADLINE_ENTRIES),
    ablations=CPU_ABLATIONS,
    frontier=CPU_FRONTIER,
    ablation_task="mqar",
    frontier_task="mqar",
    tasks={
        # The matched window at d=8, p=2 is 19 tokens a layer: two layers and their 4-tap convolutions reach
        # 2 x (18 + 3) = 42 tokens back, so every query sits more than 48 tokens after its key (the demo's far
        # cell, retention/configs/experiment/mqar_demo.yaml, at head dim 8). Three seeds on this task only (the
        # headline's recall cell). 200 steps of 64 x 64 tokens, so that 49 runs fit the budget.
        "mqar": Task(
            "mqar",
            MQAR_RECIPE,
            lrs=(1e-3, 3e-3, 1e-2),
            seeds=(0, 1, 2),
            test_scales=(1, 16),
            long_lengths=(65536,),
            test_batches=2,
            test_tokens=65536,
        ),
        "passkey": Task(
            "passkey",
            PASSKEY_RECIPE,
            lrs=(1e-3, 3e-3, 1e-2),
            seeds=(0,),
            skip=("swa",),  # W (16 tokens) is the matched window (19) less 3 tokens: on MQAR only
            test_scales=(1, 16),
            long_lengths=(65536,),
            test_batches=2,
            test_tokens=65536,
        ),
        "text": Task(
            "text",
            TEXT_RECIPE,
            lrs=(1e-3, 3e-3, 1e-2),
            seeds=(0,),
            skip=("swa",),  # W (16 tokens) is the matched window (19) less 3 tokens: on MQAR only
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
        **{e: "time: the cpu preset evaluates 64k for the headline only" for e in (*CPU_ABLATIONS, *CPU_FRONTIER)},
    },
)
# Measured (2026-12-01, 2 shared cores, outputs/compare/cpu/timings.json): the speed sweep 580 CPU s; 63 training
# runs about 2,200 (35 a run: mqar 200 steps, passkey and text 60, mostly compilation and evals); seeds 235; 37 test
# evals 130. About 52 CPU minutes: half an hour on 2 idle cores in two parts side by side (--part 1/2, 2/2).
CPU_ESTIMATE = "about 30 minutes on 2 idle cores in two parts (52 CPU minutes measured)"

GPU_MODEL = (
    "model.n_layers=8",
    "model.n_heads=8",
    "model.n_kv_heads=8",
    "model.head_dim=64",
    "model.window=512",
    "model.conv_size=4",
    "model.qk_norm=true",
    "model.target_params=30000000",
    "model.dtype=bfloat16",
)
GPU_RECALL_MODEL = ("model.n_layers=2", "model.head_dim=32", "model.target_params=8000000")
GPU_MQAR_CELL = ("data.seq_len=4096", "data.num_kv_pairs=64", "data.vocab_size=8192", "data.min_gap=1100")
GPU_WINDOWS, GPU_HEAD_DIMS = (64, 256, 2048), (16, 64)
GPU = Preset(
    name="gpu",
    model=GPU_MODEL,
    entries=_entries(GPU_WINDOWS, GPU_HEAD_DIMS),
    headline=tuple(HEADLINE_ENTRIES),
    ablations=tuple(ablation_entries()),
    frontier=_frontier(GPU_WINDOWS, GPU_HEAD_DIMS),
    ablation_task="mqar",
    frontier_task="mqar",
    tasks={
        # Zoology's depth for recall (2 layers); at d=32, p=2 in bf16 the matched window is about 544 tokens a
        # layer, so queries start 1,100 tokens after the pairs.
        "mqar": Task(
            "mqar",
            with_overrides(
                MQAR_RECIPE,
                *GPU_MQAR_CELL,
                "data.batch_size=32",
                "optim.warmup_steps=300",
                "trainer.steps=4000",
                "trainer.eval_batches=8",
                "trainer.eval_scales=[1,4]",
            ),
            lrs=(3e-4, 1e-3, 3e-3),
            seeds=(0, 1, 2),
            test_scales=(1, 16),
            test_tokens=262144,
            models={"*": GPU_RECALL_MODEL},
        ),
        "passkey": Task(
            "passkey",
            with_overrides(
                PASSKEY_RECIPE,
                "data.seq_len=4096",
                "data.batch_size=16",
                "optim.warmup_steps=200",
                "trainer.steps=3000",
                "trainer.log_every=50",
                "trainer.eval_batches=4",
                "trainer.eval_scales=[1,4]",
            ),
            lrs=(3e-4, 1e-3, 3e-3),
            seeds=(0, 1, 2),
            test_scales=(1, 16),
            test_tokens=262144,
        ),
        "text": Task(
            "text",
            with_overrides(
                TEXT_RECIPE,
                "data.seq_len=2048",
                "data.batch_size=32",
                "optim.warmup_steps=500",
                "trainer.steps=10000",
                "trainer.log_every=50",
                "trainer.eval_batches=16",
                "trainer.eval_scales=[1,2,4,8,16]",
            ),
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

GPU_SMALL_MODEL = with_overrides(GPU_MODEL, "model.n_layers=4")  # 4 layers: compilation dominates a 10-minute call
GPU_SMALL = Preset(
    name="gpu_small",
    model=GPU_SMALL_MODEL,
    entries=HEADLINE_ENTRIES,
    headline=("softmax", "swa_matched", "power", "hybrid"),
    tasks={
        "mqar": Task(
            "mqar",
            with_overrides(
                MQAR_RECIPE, *GPU_MQAR_CELL, "data.batch_size=16", "optim.warmup_steps=100", "trainer.steps=600"
            ),
            lrs=(1e-3,),
            seeds=(0,),
            test_scales=(1, 16),
            test_batches=2,
            test_tokens=262144,
            models={"*": GPU_RECALL_MODEL},
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

SMOKE_MODEL = (
    "model.n_layers=2",
    "model.n_heads=2",
    "model.n_kv_heads=2",
    "model.head_dim=8",
    "model.window=8",
    "model.conv_size=4",
    "model.qk_norm=true",
    "model.target_params=20000",
)
SMOKE = Preset(
    name="smoke",
    model=SMOKE_MODEL,
    entries={
        **{k: HEADLINE_ENTRIES[k] for k in ("softmax", "swa_matched", "power")},
        "power_nogate": ablation_entries()["power_nogate"],
        "softmax_kv4": frontier_entries((), ())["softmax_kv4"],
    },
    headline=("softmax", "swa_matched", "power"),
    ablations=("power_nogate",),
    frontier=("softmax_kv4",),
    ablation_task="mqar",
    frontier_task="mqar",
    tasks={
        "mqar": Task(
            "mqar",
            with_overrides(
                MQAR_RECIPE,
                "data.vocab_size=80",
                "data.batch_size=4",
                "~optim.weight_decay",
                "optim.warmup_steps=1",
                "trainer.steps=3",
                "trainer.log_every=1",
                "trainer.eval_batches=1",
                "trainer.eval_scales=[1,2]",
            ),
            lrs=(1e-3, 1e-2),
            seeds=(0, 1),
            test_scales=(1, 4),
            long_lengths=(1024,),
            test_batches=1,
            test_tokens=256,
            decode_chunk=32,
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

DEMO_YAML = Path(CONFIG_DIR) / "experiment" / "mqar_demo.yaml"


def _override_value(value) -> str:
    """A YAML value as Hydra's command line writes it: [1,4], true, 0.01."""
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def demo_overrides(group: str, leave_out: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What retention/configs/experiment/mqar_demo.yaml sets in `group` (model, data, optim, trainer) as override
    strings, less the keys in `leave_out` (the sweep's own model.name interpolation is always left out)."""
    values = OmegaConf.to_container(OmegaConf.load(DEMO_YAML)[group], resolve=False)
    skip = {*leave_out, "name"} if group == "model" else set(leave_out)
    return tuple(f"{group}.{k}={_override_value(v)}" for k, v in values.items() if k not in skip)


# The demo as a preset: `make demo`'s far cell and models, read from its YAML (the cell is written there only), so
# the comparison's protocol (lr sweep, seeds, test eval, report) runs on exactly the demo's runs.
DEMO = Preset(
    name="demo",
    model=demo_overrides("model"),
    entries={k: HEADLINE_ENTRIES[k] for k in ("softmax", "swa", "power", "hybrid")},
    headline=("softmax", "swa", "power", "hybrid"),
    tasks={
        "mqar": Task(
            "mqar",
            (
                *demo_overrides("data"),
                *demo_overrides("optim", ("lr",)),
                *demo_overrides("trainer", ("ckpt_every",)),
                *QUALITY_TRAINER,
            ),
            lrs=(float(OmegaConf.load(DEMO_YAML).optim.lr),),
            seeds=(0,),
            test_scales=(1, 4),
            test_tokens=8192,
        ),
    },
    speed=None,
    peak_flops=3.24e11,
)

PRESETS = {p.name: p for p in (CPU, GPU_SMALL, GPU, SMOKE, DEMO)}
