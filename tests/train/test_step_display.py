"""The trainer's step display: a step counts as done when its loss is ready (in dispatch order), not when it is
queued; off a terminal it writes no bar frames, only a log line every so many seconds and at the end."""

import io
import logging

import jax.numpy as jnp

from retention.train.progress import StepDisplay


class Loss:
    """A stand-in for a step's loss on the device: ready once the test says so."""

    def __init__(self):
        self.ready = False

    def is_ready(self) -> bool:
        return self.ready


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_step_counts_when_its_loss_is_ready():
    display = StepDisplay(10, 3, True, stream=Terminal())
    losses = [Loss() for _ in range(4)]
    for loss in losses[:3]:
        display.queued(loss)
    assert display.done == 3 and display.bar.n == 3  # three dispatched, none finished
    losses[1].ready = True  # a later step ready before an earlier one counts only after it
    display.queued(losses[3])
    assert display.done == 3
    losses[0].ready = True
    display.queued(jnp.ones(()))  # a real device array: is_ready, no copy
    assert display.done == 5 and display.bar.n == 5
    display.arrived(loss="1.000")  # the metrics were fetched: every queued step is done
    assert display.done == 8 and display.bar.n == 8 and display.bar.postfix == "loss=1.000"
    display.close()


def test_off_a_terminal_a_log_line_every_period_and_no_frames(caplog):
    now = [100.0]
    stream = io.StringIO()
    display = StepDisplay(6, 0, True, stream=stream, every_s=20.0, clock=lambda: now[0])
    assert display.bar is None
    ready = jnp.zeros(())
    with caplog.at_level(logging.INFO, logger="retention.train.progress"):
        for _ in range(6):
            now[0] += 10.0
            display.queued(ready)
        display.close()
    lines = [r.getMessage() for r in caplog.records]
    assert stream.getvalue() == ""  # no tqdm frames in a log
    assert len(lines) == 3, lines  # every 20 s: after steps 2, 4 and 6 (10 s each)
    assert lines[0].startswith("step 2/6, 0.10 steps/s, 40 s left"), lines
    assert lines[-1].startswith("step 6/6, 0.10 steps/s, 0 s left"), lines


def test_disabled_shows_nothing(caplog):
    stream = Terminal()
    with caplog.at_level(logging.INFO, logger="retention.train.progress"):
        display = StepDisplay(2, 0, False, stream=stream, every_s=0.0)
        display.queued(jnp.zeros(()))
        display.arrived()
        display.close()
    assert display.done == 1 and stream.getvalue() == "" and not caplog.records
