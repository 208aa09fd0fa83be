"""The loss by position as one figure: the curve's points from the eval's `loss_pos_{lo}_{hi}` (by upper edge, NaN
buckets left out) against hand-made values, the figure's lines, a failed write logged without stopping anything,
and a tiny text run writing loss_by_position.png beside summary.json and the TensorBoard image at each eval, its
plotted points the summary's values; an MQAR run draws nothing."""

import io
import json
import logging
import math
import re

import matplotlib.image
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from retention.train import position_plot, train
from retention.train.metrics import MetricsWriter
from retention.train.position_plot import (
    IMAGE_TAG,
    PLOT_FILE,
    PositionPlot,
    figure_pixels,
    loss_by_position,
    png_bytes,
    position_figure,
)
from tests.train.common import compose_config
from tests.train.test_text_eval import text_run

BUCKET = re.compile(r"^loss_pos_(\d+)_(\d+)$")


def read_png(data) -> np.ndarray:
    """The pixels [H, W, C] (uint8) of a PNG file's path or bytes."""
    source = io.BytesIO(data) if isinstance(data, bytes) else data
    return np.round(matplotlib.image.imread(source, "png") * 255).astype(np.uint8)


def test_loss_by_position_orders_by_upper_edge_and_leaves_out_nan():
    values = {"loss": 9.0, "loss_pos_8_10": 1.0, "loss_pos_2_4": 3.0, "loss_pos_0_1": 5.0, "accuracy": 0.5}
    values |= {"loss_pos_1_2": math.nan, "loss_pos_4_8": 2.0}  # buckets [0,1) [1,2) [2,4) [4,8) [8,10) of 10
    positions_P, losses_P = loss_by_position(values, 10)
    np.testing.assert_array_equal(positions_P, [1, 4, 8, 10])
    np.testing.assert_array_equal(losses_P, [5.0, 3.0, 2.0, 1.0])
    positions_P, losses_P = loss_by_position({"loss_pos_0_1": None}, 1)  # summary.json's NaN
    assert positions_P.shape == losses_P.shape == (0,)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="seq_len"):
        loss_by_position({"loss_pos_0_1": 1.0}, 0)
    with pytest.raises(ValueError, match="values lacks.*loss_pos_2_4"):
        loss_by_position({"loss_pos_0_1": 1.0, "loss_pos_1_2": 1.0}, 4)
    with pytest.raises(ValueError, match="evals"):
        position_figure({16: {"loss": 1.0}}, "mqar")
    with pytest.raises(ValueError, match="pixels_HWC"):
        MetricsWriter("unused", enabled=False).image(0, "t", np.zeros((4, 4), np.uint8))


def test_the_figure_has_one_line_per_text_length():
    evals = {
        32: {"loss": 2.0, "loss_pos_0_1": 4.0, "loss_pos_1_2": 3.5, "loss_pos_2_4": 3.0, "loss_pos_4_8": 2.5}
        | {"loss_pos_8_16": 2.0, "loss_pos_16_32": 1.5},
        8: {"loss": 3.0, "loss_pos_0_1": 4.1, "loss_pos_1_2": 3.6, "loss_pos_2_4": math.nan, "loss_pos_4_8": 2.6},
        64: {"loss": 1.0},  # no position losses: no line
    }
    fig = position_figure(evals, "hybrid (PA) at step 3")
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.get_title() == "hybrid (PA) at step 3"
    assert "position (tokens" in ax.get_xlabel() and ax.get_ylabel() == "loss (nats/token)"
    assert [line.get_label() for line in ax.lines] == ["eval length 8", "eval length 32"]
    np.testing.assert_array_equal(ax.lines[0].get_xydata(), [[1, 4.1], [2, 3.6], [8, 2.6]])
    np.testing.assert_array_equal(ax.lines[1].get_xydata()[:, 0], [1, 2, 4, 8, 16, 32])
    pixels_HW4 = figure_pixels(fig)
    assert pixels_HW4.dtype == np.uint8 and pixels_HW4.shape == (420, 640, 4)
    np.testing.assert_array_equal(read_png(png_bytes(pixels_HW4)), pixels_HW4)


def test_a_failed_write_is_a_warning_and_draws_nothing(tmp_path, caplog):
    (tmp_path / "file").write_text("not a folder")
    writer = MetricsWriter(str(tmp_path / "tb"))
    plot = PositionPlot(str(tmp_path / "file"), "hybrid (PA)")  # the PNG's folder is a file: OSError
    text_eval = {f"loss_pos_{lo}_{hi}": 1.0 for lo, hi in [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16)]}
    with caplog.at_level(logging.WARNING, logger=position_plot.__name__):
        assert not plot.write(2, {16: text_eval}, writer)
    writer.close()
    (record,) = caplog.records
    assert PLOT_FILE in record.getMessage() and record.exc_info is not None  # the traceback, not silence
    assert not plot.write(2, {16: {"loss": 1.0}}, writer)  # nothing to draw: no warning either
    assert len(caplog.records) == 1


def tb_images(logdir) -> list:
    """The image events of IMAGE_TAG in a TensorBoard run folder (none when there is no such tag)."""
    events = EventAccumulator(str(logdir), size_guidance={"images": 0})
    events.Reload()
    return events.Images(IMAGE_TAG) if IMAGE_TAG in events.Tags()["images"] else []


@pytest.mark.integration
def test_a_text_run_draws_its_loss_by_position(tmp_path, monkeypatch):
    figures, draw = [], position_plot.position_figure

    def drawn(*args):
        figures.append(draw(*args))  # each figure the loop draws, to read its plotted points back
        return figures[-1]

    monkeypatch.setattr(position_plot, "position_figure", drawn)
    run = tmp_path / "run"
    summary = train(compose_config(text_run(tmp_path, ["trainer.steps=4", "trainer.eval_every=2"])), str(run))
    assert (run / "summary.json").exists() and (run / PLOT_FILE).exists()
    assert len(figures) == 2  # one per eval: steps 2 and 4 (the last is the final eval)
    (ax,) = figures[-1].axes
    assert "hybrid" in ax.get_title() and "step 4" in ax.get_title()
    saved = json.loads((run / "summary.json").read_text())
    assert (
        [line.get_label() for line in ax.lines]
        == [f"eval length {L}" for L in saved["eval"]]
        == [
            "eval length 16",
            "eval length 32",
        ]
    )
    for line, values in zip(ax.lines, saved["eval"].values()):
        points = sorted((int(m[2]), v) for k, v in values.items() if (m := BUCKET.match(k)) and v is not None)
        assert len(points) >= 5
        np.testing.assert_allclose(line.get_xydata(), points, rtol=1e-12)
    assert saved == summary
    images = tb_images(run / "tb")
    assert [image.step for image in images] == [2, 4]
    png = read_png(run / PLOT_FILE)
    np.testing.assert_array_equal(read_png(images[-1].encoded_image_string), png)  # the file's pixels
    assert (images[-1].height, images[-1].width) == png.shape[:2]


def test_an_mqar_run_draws_nothing(finished_run):
    assert not (finished_run.folder / PLOT_FILE).exists()
    assert tb_images(finished_run.folder / "tb") == []
