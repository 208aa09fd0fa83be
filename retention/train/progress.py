"""The loop's bookkeeping of losses and speed, with no host sync per step: each step's metrics stay on the
devices until `fetch` (every log_every steps, and before a checkpoint), which also checks the losses are finite.
Throughput is measured per log window (steps fetched / seconds), with evaluation and checkpoint time left out.
`StepDisplay` shows the steps done: a step counts when its loss has arrived, not when it is queued; a tqdm bar on
a terminal, a log line every so many seconds elsewhere (a log file gets no bar frames)."""

import collections
import contextlib
import logging
import math
import statistics
import sys
import time

import jax
from tqdm import tqdm

from retention.train.metrics import throughput

log = logging.getLogger(__name__)
LOG_EVERY_S = 30.0  # off a terminal: seconds between progress lines


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


class StepDisplay:
    """The steps done out of `total` (from `initial`): `queued(loss)` after each dispatch counts every step at the
    head of the queue whose loss is ready (`jax.Array.is_ready`, no wait, no copy); `arrived()` counts all queued
    steps (their metrics were just fetched). On a terminal `stream` (default stderr) a tqdm bar; elsewhere a log
    line at most every `every_s` seconds (steps done, steps/s since the start, the time left) and at the end;
    nothing when not `enabled`."""

    def __init__(self, total: int, initial: int, enabled: bool, *, stream=None, every_s=LOG_EVERY_S, clock=None):
        stream = sys.stderr if stream is None else stream
        self.total, self.initial, self.done, self.every_s = total, initial, initial, every_s
        self.clock = clock or time.monotonic
        self.start = self.last_line = self.clock()
        self.waiting, self.postfix = collections.deque(), ""
        on_terminal = enabled and stream.isatty()
        self.enabled = enabled
        self.bar = (
            tqdm(total=total, initial=initial, file=stream, unit="step", dynamic_ncols=True) if on_terminal else None
        )

    def queued(self, loss) -> None:
        """A step's loss (a device array) was dispatched; count the steps whose loss is now ready."""
        self.waiting.append(loss)
        ready = 0
        while self.waiting and self.waiting[0].is_ready():
            self.waiting.popleft()
            ready += 1
        self._advance(ready)

    def arrived(self, **postfix) -> None:
        """Every queued step's loss is on the host; `postfix` (loss=..., tok_s=...) is shown beside the count."""
        self.postfix = " ".join(f"{k} {v}" for k, v in postfix.items())
        if self.bar is not None and postfix:
            self.bar.set_postfix(postfix)
        ready = len(self.waiting)
        self.waiting.clear()
        self._advance(ready)

    def _advance(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and n and (self.clock() - self.last_line >= self.every_s or self.done == self.total):
            self.last_line = self.clock()
            rate = (self.done - self.initial) / max(self.last_line - self.start, 1e-9)
            left = (self.total - self.done) / rate if rate > 0 else math.inf
            log.info("step %d/%d, %.2f steps/s, %.0f s left %s", self.done, self.total, rate, left, self.postfix)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
