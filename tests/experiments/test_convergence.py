"""The convergence rule (retention/train/convergence.py) on synthetic curves whose answer is known: a sigmoid
that leaves a plateau, a plateau that never leaves, a curve still climbing at its cap, noise below min_delta; and
the learning curve read back from a TensorBoard log."""

import numpy as np
import pytest

from experiments.compare.convergence import learning_curve
from retention.train.convergence import convergence, crossing_steps, stopping_index
from retention.train.metrics import MetricsWriter

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration


def test_a_curve_that_leaves_its_plateau_converges_after_the_jump():
    """On the 1/pairs plateau (0.25 + noise below min_delta) to step 2000, a jump to 0.6, 0.97, then 0.99-1.0
    (rises under min_delta) to step 6000, evals every 250 steps: patience alone stops it on the plateau (step
    1250, 4 evals after its start); from min_step 2500 on it stops 4 evals after the last rise by more than
    min_delta (2750: 0.97 -> 0.99), and it crosses 0.5 and 0.9 of its final value at 2250 and 2500."""
    rng = np.random.default_rng(3)
    plateau = list(0.25 + rng.uniform(-0.002, 0.002, 8))  # steps 250 .. 2000
    top = list(1.0 - rng.uniform(0, 0.004, 14))  # steps 2750 .. 6000, within min_delta of each other
    values = [*plateau, 0.6, 0.97, *top]
    steps = list(range(250, 6001, 250))
    assert len(steps) == len(values)
    assert convergence(steps, values, patience=4, min_delta=0.005).converged_step == 1250
    rule = convergence(steps, values, patience=4, min_delta=0.005, min_step=2500)
    assert rule.converged_step == 2750 + 4 * 250
    final = values[-1]
    assert rule.crossings == {0.5: 2250, 0.9: 2500} and rule.final == final and rule.best == max(values)


def test_a_plateau_converges_early_and_a_climbing_curve_does_not():
    """A flat curve with noise below min_delta stops after `patience` evals: converged on the plateau. A curve
    that improves at every eval never stops before its cap (None: "not yet")."""
    rng = np.random.default_rng(5)
    flat = list(0.3 + rng.uniform(-0.002, 0.002, 20))
    assert stopping_index(flat, patience=3, min_delta=0.005) == 3
    climbing = list(np.linspace(0.1, 0.9, 20))
    assert stopping_index(climbing, patience=3, min_delta=0.005) is None
    assert convergence(list(range(20)), climbing, patience=3).converged_step is None


def test_an_improvement_resets_the_patience():
    """3 evals without improvement, then a rise: with patience 4 the rule waits past the rise."""
    values = [0.2, 0.3, 0.3, 0.3, 0.3, 0.5, 0.5, 0.5, 0.5, 0.5]
    assert stopping_index(values, patience=4) == 9
    assert stopping_index(values, patience=3) == 4


def test_crossings_of_a_curve_without_a_positive_final_value_are_none():
    assert crossing_steps([1, 2], [0.0, 0.0]) == {0.5: None, 0.9: None}


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="patience"):
        stopping_index([0.1], patience=0)
    with pytest.raises(ValueError, match="equally long"):
        convergence([1, 2], [0.1], patience=2)


def test_learning_curve_from_a_tensorboard_log(tmp_path):
    """The trainer's eval tag and train/tokens_seen come back as (step, tokens, value), also across a resume: the
    second writer (purge_step 200, as the trainer's resume) and the tokens-indexed twins' large steps lose no eval."""
    first = MetricsWriter(str(tmp_path / "tb"))
    for step, value in [(100, 0.25), (200, 0.5)]:
        first.scalars(step, {"tokens_seen": step * 64}, "train")
        first.scalars(step, {"accuracy": value}, "eval/x1", tokens=step * 64)
    first.close()
    (events,) = (tmp_path / "tb").iterdir()  # named by the second it opened in: make it the earlier of the two
    prefix, stamp, host = events.name.split(".", 4)[:3], events.name.split(".")[3], events.name.split(".", 4)[4]
    events.rename(events.with_name(".".join([*prefix, str(int(stamp) - 1), host])))
    resumed = MetricsWriter(str(tmp_path / "tb"), purge_step=200)
    for step, value in [(300, 0.75), (400, 0.8)]:
        resumed.scalars(step, {"tokens_seen": step * 64}, "train")
        resumed.scalars(step, {"accuracy": value}, "eval/x1", tokens=step * 64)
    resumed.close()
    curve = [(100, 6400, 0.25), (200, 12800, 0.5), (300, 19200, 0.75), (400, 25600, 0.8)]
    assert [(s, n, pytest.approx(v)) for s, n, v in learning_curve(tmp_path)] == curve
