"""The recovery bench's reading (experiments/recovery.py) on a made-up record with known numbers: the share of the
conversion's loss won back, the table's rows, the sentence per pattern, the loss-by-position buckets and the
figure. The runs themselves are the trainer's, tested in tests/train."""

import pytest

from experiments.recovery import LONG, by_position, main, metrics, plot, reading, recovered, report

pytestmark = pytest.mark.integration  # the experiments over the library: make test-integration


def entry(bpb: float, tokens: int, curve=()) -> dict:
    """A run's numbers: bits per byte bpb at T and bpb + 0.5 at 16T, losses by position falling from 3.0."""
    by_position = {"0_1": 3.0, "1_2": 2.8, "2_4": 2.6, "4_8": 2.4, "8_16": 2.2}
    numbers = {"bpb@1x": bpb, f"bpb@{LONG}x": bpb + 0.5, "loss@1x": bpb, f"loss@{LONG}x": bpb, "tokens": tokens}
    return {**numbers, "loss_by_position": by_position, "curve": [list(c) for c in curve]}


RECORD = {
    "recipe": {"teacher": ["model=softmax", "trainer.steps=100"], "tokens_per_step": 4096},
    "teacher": {**entry(2.0, 400_000), "train_loss": [[s, 3.0 - s / 100] for s in range(10, 101, 10)]},
    "patterns": {
        "PA": {
            "converted": {"layer_kinds": "PAPA", **entry(3.0, 0)},
            "fine_tuned": {
                "plain": entry(2.5, 40_000, [(20_000, 2.7), (40_000, 2.5)]),
                "KL": entry(2.25, 40_000, [(20_000, 2.6), (40_000, 2.25)]),
            },
            "scratch": entry(2.4, 440_000, [(220_000, 2.9), (440_000, 2.4)]),
        }
    },
}


def test_the_share_won_back_is_the_conversions_loss_closed():
    assert recovered(3.0, 2.5, 2.0) == pytest.approx(0.5)
    assert recovered(3.0, 3.0, 2.0) == 0.0
    assert recovered(3.0, 1.9, 2.0) == pytest.approx(1.1)  # past the teacher


def test_metrics_take_bits_per_byte_and_the_long_evals_position_buckets():
    short = {"bits_per_byte": 2.0, "loss": 1.4, "loss_pos_0_1": 9.0}
    long = {"bits_per_byte": 2.5, "loss": 1.7, "loss_pos_0_1": 3.0, "loss_pos_1_2": 2.0}
    out = metrics(short, long)
    assert out["bpb@1x"] == 2.0 and out[f"bpb@{LONG}x"] == 2.5 and out["loss@1x"] == 1.4
    assert out["loss_by_position"] == {"0_1": 3.0, "1_2": 2.0}  # the long eval's, not the short one's
    assert by_position(entry(2.0, 0)) == ([4, 8, 16], [2.6, 2.4, 2.2])  # from position 2 on


def test_report_rows_and_reading_say_the_numbers(tmp_path):
    text = report(RECORD, "recovery.png")
    assert "| PA: fine-tuned, plain | 0.04M | 2.500 | 3.000 | 50% | 0.44M |" in text
    assert "| PA: fine-tuned, KL | 0.04M | 2.250 | 2.750 | 75% | 0.44M |" in text
    assert "| PA: from scratch | 0.44M | 2.400 | 2.900 |  | 0.44M |" in text
    line = reading(RECORD)
    assert "after 10% of the teacher's tokens the better fine-tune (KL) is 0.250 bpb above the teacher" in line
    assert "(75% of the conversion's loss won back), and 0.150 bpb better than PA trained from scratch" in line
    assert "(that run's held-out bpb fell by 0.500 over its last eval interval)" in line
    assert "was 2.500 at 40-50% of its 100 steps and 2.000 at 90-100%: still falling" in line
    assert plot(RECORD, tmp_path / "recovery.png") == "recovery.png" and (tmp_path / "recovery.png").stat().st_size


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--fraction", "0"], r"--fraction must be a finite number in \(0, 1\], got 0.0"),
        (["--evals", "0"], r"--evals must be an int >= 1, got 0"),
        (["--teacher-steps", "-3"], r"--teacher-steps must be an int >= 1, got -3"),
        (["--patterns", "PX"], r"pattern must be .*got 'PX'"),
    ],
)
def test_bad_arguments_are_refused_before_any_run(tmp_path, monkeypatch, argv, match):
    monkeypatch.setattr("sys.argv", ["recovery", *argv, "--root", str(tmp_path / "runs")])
    with pytest.raises(ValueError, match=match):
        main()
    assert not (tmp_path / "runs").exists()
