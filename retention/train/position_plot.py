"""The loss by position of a text run as one figure: the held-out loss of each position bucket (evaluate.py's
`loss_pos_{lo}_{hi}`) against position, one line per eval length, drawn with matplotlib's object API (a `Figure`
on the Agg canvas, no pyplot state). The loop writes it at each eval, and so at the end, as `loss_by_position.png`
beside summary.json and as the TensorBoard image `eval/loss_by_position`; the scalar tags stay as they are.

A bucket [lo, hi) is drawn at its upper edge hi on a log x axis (the first bucket, [0, 1), at 1): the most tokens
of context a target of the bucket has. A bucket without a labelled target (NaN) is left out of its line. The loss
is the eval's `loss` unit, nats per token. A plot never stops a run: `PositionPlot.write` logs a failure with its
traceback as a warning and the run goes on. matplotlib comes with the `train` extra like the trainer's other
libraries: without it `import retention.train` fails naming the extra.
"""

import dataclasses
import io
import logging
import math
import os

import matplotlib.image
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from retention.train.evaluate import position_buckets, position_key
from retention.train.metrics import MetricsWriter
from retention.train.record import write_bytes

PLOT_FILE = "loss_by_position.png"
IMAGE_TAG = "eval/loss_by_position"

log = logging.getLogger(__name__)


def has_position_losses(values: dict[str, float]) -> bool:
    """Whether an eval's metrics hold the loss by position (a text eval's: every one has the bucket [0, 1))."""
    return position_key(0, 1) in values


def loss_by_position(values: dict[str, float], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The points of one eval length's curve: each bucket's upper edge and mean loss, by position.

    Args:
        values: an eval's metrics, holding `loss_pos_{lo}_{hi}` for every bucket of `seq_len` (other names are
            ignored; a NaN or None bucket, one without a labelled target, is left out).
        seq_len: the eval length whose buckets (`position_buckets`) are read.

    Returns:
        (positions_P, losses_P): float64 arrays, the buckets' upper edges ascending and their losses.

    Raises:
        ValueError: seq_len below 1, or values without a bucket of seq_len.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, not {seq_len}")
    keys = {hi: position_key(lo, hi) for lo, hi in position_buckets(seq_len)}
    if missing := [k for k in keys.values() if k not in values]:
        raise ValueError(f"values lacks {missing} of the position buckets of seq_len={seq_len}")
    points = [(hi, float(values[k])) for hi, k in keys.items() if values[k] is not None and math.isfinite(values[k])]
    positions_P, losses_P = np.array(points, np.float64).reshape(-1, 2).T
    return positions_P, losses_P


def position_figure(evals: dict[int, dict[str, float]], title: str) -> Figure:
    """Held-out loss against position, one line (labelled by its length) per eval length with position losses.

    Args:
        evals: {eval length: that eval's metrics}, as summary.json's `eval` with int keys; lengths without
            position losses (not a text eval) are left out.
        title: the figure's title (the model, its layers, the step).

    Returns:
        The figure: its one axes holds a line per length, shortest first, x the positions and y the losses of
        `loss_by_position`.

    Raises:
        ValueError: no length of evals has position losses.
    """
    curves = {L: loss_by_position(v, L) for L, v in sorted(evals.items()) if has_position_losses(v)}
    if not curves:
        raise ValueError(f"evals holds no position losses ({position_key(0, 1)}, ...) at any length: {list(evals)}")
    fig = Figure(figsize=(6.4, 4.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for L, (positions_P, losses_P) in curves.items():
        ax.plot(positions_P, losses_P, marker="o", label=f"eval length {L}")
    ax.set_xscale("log")
    ax.set_xlabel("position (tokens; bucket [lo, hi) at hi)")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def figure_pixels(fig: Figure) -> np.ndarray:
    """The figure drawn by Agg.

    Args:
        fig: a matplotlib figure.

    Returns:
        Its RGBA pixels [H, W, 4], uint8.
    """
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.array(canvas.buffer_rgba())


def png_bytes(pixels_HWC: np.ndarray) -> bytes:
    """A PNG file of the pixels.

    Args:
        pixels_HWC: uint8 pixels [H, W, 3 or 4].

    Returns:
        The PNG file's bytes.
    """
    buffer = io.BytesIO()
    matplotlib.image.imsave(buffer, pixels_HWC, format="png")
    return buffer.getvalue()


@dataclasses.dataclass(frozen=True)
class PositionPlot:
    """A run's loss-by-position plot: `run_dir`/loss_by_position.png and the TensorBoard image, titled `title`."""

    run_dir: str
    title: str  # the model and its layers, e.g. "hybrid (PAPA)"

    def write(self, step: int, evals: dict[int, dict[str, float]], writer: MetricsWriter) -> bool:
        """Draw the evals at `step` into the PNG (replaced atomically) and `writer`'s image `eval/loss_by_position`.

        Args:
            step: the step of the evals (in the title and the image's step).
            evals: {eval length: that eval's metrics}.
            writer: the run's TensorBoard writer.

        Returns:
            Whether it drew: False when no eval has position losses (not a text run), or when drawing or writing
            failed (logged as a warning with the traceback: a plot never stops a run).
        """
        if not any(has_position_losses(v) for v in evals.values()):
            return False
        try:
            pixels_HW4 = figure_pixels(position_figure(evals, f"{self.title} at step {step}"))
            write_bytes(os.path.join(self.run_dir, PLOT_FILE), png_bytes(pixels_HW4))
            writer.image(step, IMAGE_TAG, pixels_HW4)
        except Exception:  # the run goes on; the warning carries the traceback
            log.warning("could not draw %s at step %d; the run goes on without it", PLOT_FILE, step, exc_info=True)
            return False
        return True
