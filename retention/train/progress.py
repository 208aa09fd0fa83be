"""The loop's bookkeeping of losses and speed, with no host sync per step: each step's metrics stay on the
devices until `fetch` (every log_every steps, and before a checkpoint), which also checks the losses are finite.
Throughput is measured per log window (steps fetched / seconds), with evaluation and checkpoint time left out."""

import contextlib
import math
import statistics
import time

import jax

from retention.train.metrics import throughput


class Progress:
    """Metrics of the steps since the last fetch (on device) and since the last log (on host), the run's first
    loss and last logged loss, and the tokens/s of each logged window; `saved` is a checkpoint's `record()`.
    FLOP/s are training FLOPs per token times tokens/s, against `peak_flops`."""

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak_flops: float, saved: dict):
        self.tokens_per_step, self.flops_per_token, self.peak_flops = tokens_per_step, flops_per_token, peak_flops
        self.pending, self.window, self.rates = [], [], []
        self.initial_loss = saved.get("initial_loss")  # the run's first loss, kept across resumes
        self.train_loss = saved.get("train_loss")
        self.saved_rate = saved.get("tokens_per_s")
        self.restart_clock()

    def restart_clock(self) -> None:
        self.clock, self.excluded = time.perf_counter(), 0.0

    def fetch(self, step: int) -> None:
        """Bring the pending metrics (of the steps up to `step`) to the host; FloatingPointError on a NaN or inf
        loss, naming its step."""
        host = jax.device_get(self.pending)
        self.pending = []
        for i, metrics in enumerate(host):
            metrics = {k: float(v) for k, v in metrics.items()}
            if not math.isfinite(metrics["loss"]):
                raise FloatingPointError(f"the loss is {metrics['loss']} at step {step - len(host) + i + 1}")
            if self.initial_loss is None:
                self.initial_loss = metrics["loss"]
            self.window.append(metrics)

    def perf(self, tokens_per_s: float | None) -> dict:
        """tokens/s, FLOP/s and peak fraction (None each without a rate), and the seconds per step."""
        if tokens_per_s is None:
            return dict.fromkeys(("tokens_per_s", "flops_per_s", "peak_fraction", "step_time_s"))
        seconds = self.tokens_per_step / tokens_per_s
        perf = throughput(self.tokens_per_step, seconds, self.flops_per_token, self.peak_flops)
        return {**perf, "step_time_s": seconds}

    def log(self, step: int) -> tuple[dict, dict]:
        """(the mean of each metric over the window ending at `step`, the window's `perf`); starts a new window."""
        self.fetch(step)
        seconds = time.perf_counter() - self.clock - self.excluded
        rate = len(self.window) * self.tokens_per_step / max(seconds, 1e-12)
        mean = {k: statistics.fmean(m[k] for m in self.window) for k in self.window[0]}
        self.train_loss = mean["loss"]
        self.rates.append(rate)
        self.window = []
        self.restart_clock()
        return mean, self.perf(rate)

    @contextlib.contextmanager
    def paused(self, state):
        """Within the block (evaluation, a checkpoint) the clock stops, once the queued steps on `state` are done."""
        jax.block_until_ready(state)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - start

    def tokens_per_s(self) -> float | None:
        """The median tokens/s of this process's windows, else the saved one (a rerun with nothing to train)."""
        return statistics.median(self.rates) if self.rates else self.saved_rate

    def record(self) -> dict:
        """What a checkpoint keeps of the progress (restored into a resumed run's Progress)."""
        return {"initial_loss": self.initial_loss, "train_loss": self.train_loss, "tokens_per_s": self.tokens_per_s()}
