"""trainer.early_stop: the convergence rule in the loop. A run whose held-out metric is flat (an lr of 1e-12
leaves the eval's accuracy unchanged) stops `patience` evals after its first, with a checkpoint there and the
stop written into summary.json; a run cut at its cap and resumed with a larger one counts its patience on from the
evals before the cut (an uninterrupted run's stop step), and a converged run resumed trains no further; bad values
are refused naming their key."""

import pytest

from retention.train import build, train
from tests.train.common import TINY, compose_config, fresh_seed, saved_steps

FLAT = [*TINY, "optim.lr=1e-12", "trainer.eval_every=2", "trainer.eval_scales=[1]", "trainer.ckpt_every=100"]


@pytest.mark.integration
@pytest.mark.slow  # a further case: the resume test below stops by the same rule
def test_a_flat_metric_stops_the_run_after_patience_evals(tmp_path):
    """Evals at steps 2, 4, 6 give one accuracy; with patience 2 the rule stops at the third (step 6), far below
    the cap of 40: 6 steps trained, the checkpoint at 6, the curve and the reason in the summary."""
    cfg = compose_config([*FLAT, "trainer.steps=40", "trainer.early_stop.patience=2", f"seed={fresh_seed()}"])
    summary = train(cfg, str(tmp_path))
    assert summary["stop_reason"] == "converged" and summary["stopped_at"] == 6 and summary["steps_cap"] == 40
    assert summary["steps"] == 6 and summary["tokens_seen"] == 6 * 4 * 16
    assert saved_steps(tmp_path) == [6]
    curve = summary["eval_curve"]
    assert [s for s, _ in curve] == [2, 4, 6] and len({v for _, v in curve}) == 1
    assert curve[-1][1] == summary["eval"]["16"]["accuracy"]
    # flat: at its final value from the first eval; no crossings of a final accuracy of 0 (a seed's tiny model)
    first = 2 if curve[-1][1] > 0 else None
    assert summary["crossings"] == {"0.5": first, "0.9": first}


@pytest.mark.integration
def test_patience_counts_on_across_a_resume(tmp_path):
    """Cut at a cap of 4 (evals at 2 and 4: one short of patience 2), resumed with a cap of 40: the rule stops at
    step 6, as the uninterrupted run does (a count restarted at the resume would stop at 10). Run again, the
    converged run trains nothing more."""
    seed = fresh_seed()
    common = [*FLAT, "trainer.early_stop.patience=2", f"seed={seed}"]
    first = train(compose_config([*common, "trainer.steps=4"]), str(tmp_path))
    assert first["stop_reason"] == "steps" and first["steps"] == 4 and [s for s, _ in first["eval_curve"]] == [2, 4]
    resumed = train(compose_config([*common, "trainer.steps=40"]), str(tmp_path))
    assert resumed["resumed_from"] == 4 and resumed["stop_reason"] == "converged" and resumed["steps"] == 6
    assert [s for s, _ in resumed["eval_curve"]] == [2, 4, 6]
    again = train(compose_config([*common, "trainer.steps=40"]), str(tmp_path))
    assert again["resumed_from"] == 6 and again["steps"] == 6 and again["train_traces"] == 0
    assert saved_steps(tmp_path) == [4, 6]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.early_stop.patience=-1"], "trainer.early_stop.patience must be an int >= 0, got -1"),
        (["trainer.early_stop.min_delta=-0.1"], "trainer.early_stop.min_delta must be a finite number in [0, inf)"),
        (["trainer.early_stop.min_step=-3"], "trainer.early_stop.min_step must be an int >= 0, got -3"),
        (["trainer.early_stop.metric=perplexity"], "trainer.early_stop.metric must be one of"),
        (["trainer.early_stop.metric=bits_per_byte"], "trainer.early_stop.metric='bits_per_byte' is a text metric"),
        (["trainer.early_stop.patience=2", "trainer.eval_every=0"], "set trainer.eval_every > 0"),
        (["trainer.early_stop.patience=2", "trainer.eval_scales=[2]"], "trainer.eval_scales must include 1"),
        (["trainer.early_stop.patience=2", "trainer.early_stop.min_step=40"], "min_step must be below trainer.steps"),
    ],
)
def test_bad_rule_values_are_refused_with_their_key(overrides, message):
    cfg = compose_config([*TINY, "trainer.steps=40", "trainer.eval_every=2", *overrides])
    with pytest.raises(ValueError) as error:
        build(cfg)
    assert message in str(error.value)
