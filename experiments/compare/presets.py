"""The comparison's presets: which models, lengths and tasks, and how long to train, per kind of machine.

Every preset lists Hydra overrides (the same strings `train.py` takes) shared by all models, the speed sweep
(training-step time at each length with the same tokens per step, decode time at each context) and the quality
tasks (each trained at one length and evaluated at 1x, 4x and 16x it).

- `cpu`: this 2-core machine, about an hour in all: tiny models (about 250k parameters), short runs, one seed.
- `gpu`: one H100/H200-class GPU: 8-layer models of about 30M parameters in bf16, contexts to 64k, three seeds.
- `smoke`: seconds; the pipeline end to end at toy sizes (the tests run it).
"""

from dataclasses import dataclass, field

# name -> the model config group (configs/model/) it starts from; swa_matched's window is set by
# models.matched_window so its KV cache has the bytes of the power model's state.
MODELS = {"softmax": "softmax", "swa": "swa", "swa_matched": "swa", "power": "power", "hybrid": "hybrid"}


@dataclass(frozen=True)
class Task:
    """One quality task: the data group, its overrides (length, batch, steps, optimiser, eval scales), and model
    overrides for this task only: under "*" for every model, under a model's name for that one."""

    data: str
    overrides: tuple[str, ...]
    models: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def model_overrides(self, model: str) -> tuple[str, ...]:
        """This task's extra overrides of `model`'s config."""
        return (*self.models.get("*", ()), *self.models.get(model, ()))


@dataclass(frozen=True)
class Preset:
    """What one comparison run measures; see the module docstring."""

    name: str
    model: tuple[str, ...]  # overrides of the model group shared by every model
    speed_lengths: tuple[int, ...]  # training-step lengths T
    tokens_per_step: int  # batch = tokens_per_step // T
    speed_repeats: int  # timed steps after one warm-up step
    decode_contexts: tuple[int, ...]
    decode_tokens: int  # greedy steps per timed decode loop
    tasks: dict[str, Task]
    seeds: tuple[int, ...]
    peak_flops: float  # the machine's matmul rate, for the achieved-FLOP/s column
    models: tuple[str, ...] = tuple(MODELS)


_QUALITY_TRAINER = (
    "trainer.eval_scales=[1,4,16]",
    "trainer.ckpt_every=100000",
    "trainer.keep=1",
    "trainer.progress=false",
)

CPU = Preset(
    name="cpu",
    model=(
        "model.n_layers=4",
        "model.n_heads=4",
        "model.n_kv_heads=4",
        "model.head_dim=16",
        "model.window=32",
        "model.target_params=250000",
    ),
    speed_lengths=(1024, 4096, 16384, 65536),
    tokens_per_step=65536,
    speed_repeats=2,
    decode_contexts=(1024, 4096, 16384, 65536),
    decode_tokens=32,
    tasks={
        # 4-layer softmax stayed at the 1/num_kv_pairs plateau for 1,500 steps on this machine; at 2 layers and
        # 100k parameters it recalls within 800 steps, so MQAR runs so here, and the hybrid is PA (1:1).
        "mqar": Task(
            "mqar",
            (
                "data.seq_len=32",
                "data.num_kv_pairs=4",
                "data.vocab_size=64",
                "data.batch_size=128",
                "optim.lr=3e-3",
                "optim.weight_decay=0",
                "optim.warmup_steps=50",
                "trainer.steps=800",
                "trainer.log_every=20",
                "trainer.eval_batches=4",
                *_QUALITY_TRAINER,
            ),
            models={"*": ("model.n_layers=2", "model.target_params=100000"), "hybrid": ("model.pattern=PA",)},
        ),
        "passkey": Task(
            "passkey",
            (
                "data.seq_len=128",
                "data.batch_size=32",
                "optim.lr=3e-3",
                "optim.warmup_steps=50",
                "trainer.steps=400",
                "trainer.log_every=20",
                "trainer.eval_batches=2",
                *_QUALITY_TRAINER,
            ),
        ),
        "text": Task(
            "text",
            (
                "data.seq_len=256",
                "data.batch_size=16",
                "optim.lr=3e-3",
                "optim.warmup_steps=50",
                "trainer.steps=400",
                "trainer.log_every=20",
                "trainer.eval_batches=4",
                *_QUALITY_TRAINER,
            ),
        ),
    },
    seeds=(0,),
    peak_flops=3.24e11,  # measured matmul rate of the 2-core dev machine (PERF_LOG.md)
)

GPU = Preset(
    name="gpu",
    model=(
        "model.n_layers=8",
        "model.n_heads=8",
        "model.n_kv_heads=8",
        "model.head_dim=64",
        "model.window=512",
        "model.target_params=30000000",
        "model.dtype=bfloat16",
    ),
    speed_lengths=(1024, 4096, 16384, 65536),
    tokens_per_step=262144,
    speed_repeats=5,
    decode_contexts=(1024, 4096, 16384, 65536),
    decode_tokens=128,
    tasks={
        "mqar": Task(
            "mqar",
            (
                "data.seq_len=1024",
                "data.num_kv_pairs=64",
                "data.vocab_size=8192",
                "data.batch_size=64",
                "optim.lr=1e-3",
                "optim.warmup_steps=500",
                "trainer.steps=8000",
                "trainer.log_every=50",
                "trainer.eval_batches=8",
                *_QUALITY_TRAINER,
            ),
        ),
        "passkey": Task(
            "passkey",
            (
                "data.seq_len=4096",
                "data.batch_size=16",
                "optim.lr=1e-3",
                "optim.warmup_steps=200",
                "trainer.steps=3000",
                "trainer.log_every=50",
                "trainer.eval_batches=4",
                *_QUALITY_TRAINER,
            ),
        ),
        "text": Task(
            "text",
            (
                "data.seq_len=2048",
                "data.batch_size=32",
                "optim.lr=1e-3",
                "optim.warmup_steps=500",
                "trainer.steps=10000",
                "trainer.log_every=50",
                "trainer.eval_batches=16",
                *_QUALITY_TRAINER,
            ),
        ),
    },
    seeds=(0, 1, 2),
    peak_flops=989e12,  # H100/H200 dense bf16
)

SMOKE = Preset(
    name="smoke",
    model=(
        "model.n_layers=4",
        "model.n_heads=2",
        "model.n_kv_heads=2",
        "model.head_dim=8",
        "model.window=8",
        "model.target_params=20000",
    ),
    speed_lengths=(64, 256),
    tokens_per_step=512,
    speed_repeats=1,
    decode_contexts=(64, 256),
    decode_tokens=4,
    tasks={
        "mqar": Task(
            "mqar",
            (
                "data.seq_len=32",
                "data.num_kv_pairs=4",
                "data.vocab_size=64",
                "data.batch_size=8",
                "optim.warmup_steps=2",
                "trainer.steps=6",
                "trainer.log_every=2",
                "trainer.eval_batches=1",
                *_QUALITY_TRAINER,
            ),
        ),
        "passkey": Task(
            "passkey",
            (
                "data.seq_len=32",
                "data.batch_size=8",
                "optim.warmup_steps=2",
                "trainer.steps=6",
                "trainer.log_every=2",
                "trainer.eval_batches=1",
                "data.depths=[0.0,1.0]",
                *_QUALITY_TRAINER,
            ),
        ),
    },
    seeds=(0,),
    peak_flops=3.24e11,
)

PRESETS = {p.name: p for p in (CPU, GPU, SMOKE)}
