"""Quality of the compared models: each trained with the trainer on each task of a preset, per seed, and
evaluated at 1x, 4x and 16x its training length. Every run writes under `<runs>/<task>/<model>/seed<k>/` (its
TensorBoard events in tb/, so `tensorboard --logdir <runs>` shows the whole comparison), and a finished run is
not redone: its summary.json is read back, so an interrupted comparison resumes where it stopped.
"""

import contextlib
import json
import logging
import time
from pathlib import Path

from tqdm import tqdm

from experiments.compare.models import compose_config, model_overrides
from experiments.compare.presets import Preset
from retention.train import train


@contextlib.contextmanager
def run_log(path: Path):
    """Within the block, INFO and above also go to `path` (each run's train.log, as train.py writes it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def run_dir(runs: Path, task: str, model: str, seed: int) -> Path:
    """The folder of one training run of the comparison."""
    return runs / task / model / f"seed{seed}"


def measure_quality(preset: Preset, window: int, runs: Path) -> dict:
    """{task: {model: {seed: summary.json of the run, plus its wall seconds}}}."""
    results = {}
    jobs = [(task, model, seed) for task in preset.tasks for model in preset.models for seed in preset.seeds]
    bar = tqdm(jobs, desc="quality runs", unit="run")
    for task, model, seed in bar:
        bar.set_postfix(task=task, model=model, seed=seed)
        folder = run_dir(runs, task, model, seed)
        done = folder / "summary.json"
        if done.exists():
            summary = json.loads(done.read_text())
        else:
            spec = preset.tasks[task]
            model_args = [*model_overrides(model, preset, window), *spec.model_overrides(model)]
            run_args = [f"data={spec.data}", *spec.overrides, f"seed={seed}", f"trainer.peak_flops={preset.peak_flops}"]
            cfg = compose_config([*model_args, *run_args])
            start = time.perf_counter()
            with run_log(folder / "train.log"):
                summary = train(cfg, str(folder))
            summary["wall_s"] = time.perf_counter() - start
            summary["tokens_per_step"] = cfg.data.batch_size * cfg.data.seq_len
            done.write_text(json.dumps(summary, indent=2))
        results.setdefault(task, {}).setdefault(model, {})[str(seed)] = summary
    return results
