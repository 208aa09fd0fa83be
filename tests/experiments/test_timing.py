"""The benchmarks' shared helpers: the timing loop (on a fake clock: tests never assert on wall time) and the
size formatters."""

import jax.numpy as jnp
import pytest

from experiments import timing
from experiments.formatting import human_bytes, tokens

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration


def test_run_times_warms_up_then_times_each_call(monkeypatch):
    """One untimed warm-up call, then one perf_counter pair around each timed call; the median of the spans."""
    calls, clock = [], iter([10.0, 11.0, 20.0, 23.0, 30.0, 32.0])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    fn = lambda x: calls.append(x) or jnp.full(3, x)
    assert timing.run_times(fn, 7.0, repeats=3) == [1.0, 3.0, 2.0]
    assert calls == [7.0] * 4
    clock = iter([0.0, 4.0, 0.0, 1.0])
    assert timing.median_seconds(fn, 1.0, repeats=2) == 2.5  # an even count: the mean of the middle two


def test_two_warmups_leave_the_first_call_after_compiling_untimed(monkeypatch):
    calls, clock = [], iter([0.0, 2.0, 5.0, 6.0])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    fn = lambda x: calls.append(x) or jnp.full(3, x)
    assert timing.median_seconds(fn, 3.0, repeats=2, warmups=2) == 1.5
    assert calls == [3.0] * 4


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (1023, "1,023 B"),
        (1024, "1 KiB"),
        (2**15, "32 KiB"),
        (145.4 * 2**10, "145 KiB"),
        (2**20, "1.0 MiB"),
        (2064 * 2**20 - 1, "2.0 GiB"),
        (33 * 2**20, "33.0 MiB"),
        (3.5 * 2**30, "3.5 GiB"),
        (5000 * 2**30, "5,000.0 GiB"),
    ],
)
def test_human_bytes(n, text):
    assert human_bytes(n) == text


@pytest.mark.parametrize("n, text", [(64, "64"), (1024, "1k"), (1536, "1.5k"), (65536, "64k"), (2**20, "1M")])
def test_tokens(n, text):
    assert tokens(n) == text
