"""TensorBoard logging (tensorboardX) and the throughput arithmetic behind tokens/s and achieved FLOP/s.

One event folder per run (one run entry in TensorBoard): scalars, images, and the HParams session of the run written in
the same folder (its hyperparameters when it starts, so a killed run has a row; its end when it finishes).
"""

import os

import numpy as np
from tensorboardX import SummaryWriter
from tensorboardX.summary import hparams

from retention.nn import LMConfig, flops_per_token

TOKENS_PREFIX = "vs_tokens/"  # the tokens-indexed twin of a tag: the same values with tokens seen as the step


def training_flops_per_token(config: LMConfig, seq_len: int) -> float:
    """Training FLOPs per token: 3x the forward (the backward costs about twice the forward)."""
    return 3 * flops_per_token(config, seq_len)


def throughput(tokens: int, seconds: float, flops_per_tok: float, peak_flops: float) -> dict[str, float]:
    """tokens/s, achieved FLOP/s and its fraction of `peak_flops` for `tokens` processed in `seconds`."""
    tokens_per_s = tokens / max(seconds, 1e-12)
    flops = tokens_per_s * flops_per_tok
    return {"tokens_per_s": tokens_per_s, "flops_per_s": flops, "peak_fraction": flops / peak_flops}


class MetricsWriter:
    """Scalars, images and the HParams session under `logdir`; `purge_step` drops events a killed run wrote past it."""

    def __init__(self, logdir: str, *, purge_step: int | None = None, enabled: bool = True):
        """enabled=False (a multi-host job's other processes): every call does nothing."""
        self.enabled = enabled
        if enabled:
            os.makedirs(logdir, exist_ok=True)
            self.writer = SummaryWriter(logdir, purge_step=purge_step)

    def scalars(self, step: int, values: dict[str, float], prefix: str = "", *, tokens: int | None = None) -> None:
        """One scalar per entry, tagged `prefix/name`; with `tokens` (tokens seen so far) also its twin tagged
        `vs_tokens/prefix/name` at step `tokens`, for curves against tokens (TensorBoard plots against steps)."""
        if not self.enabled:
            return
        for name, value in values.items():
            tag = f"{prefix}/{name}" if prefix else name
            self.writer.add_scalar(tag, float(value), step)
            if tokens is not None:
                self.writer.add_scalar(TOKENS_PREFIX + tag, float(value), tokens)

    def image(self, step: int, tag: str, pixels_HWC: np.ndarray) -> None:
        """One image tagged `tag` at `step` (TensorBoard's Images tab).

        Args:
            step: the training step it belongs to.
            tag: its TensorBoard tag.
            pixels_HWC: uint8 pixels [H, W, C], C = 3 (RGB) or 4 (RGBA).
        """
        if pixels_HWC.dtype != np.uint8 or pixels_HWC.ndim != 3 or pixels_HWC.shape[2] not in (3, 4):
            raise ValueError(f"pixels_HWC must be uint8 [H, W, 3 or 4], not {pixels_HWC.dtype} {pixels_HWC.shape}")
        if self.enabled:
            self.writer.add_image(tag, pixels_HWC, step, dataformats="HWC")

    def start_session(self, hparams_dict: dict, metric_tags: list[str]) -> None:
        """The run's row in TensorBoard's HParams tab: `hparams_dict` (scalars; others as text) and the scalar tags
        shown as its metrics (each column shows the tag's latest value)."""
        if not self.enabled:
            return
        clean = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams_dict.items()}
        experiment, session_start, self.session_end = hparams(clean, dict.fromkeys(metric_tags, 0.0))
        self.writer.file_writer.add_summary(experiment)
        self.writer.file_writer.add_summary(session_start)

    def end_session(self) -> None:
        """Mark the run's HParams session finished (status success), after `start_session`."""
        if self.enabled:
            self.writer.file_writer.add_summary(self.session_end)

    def close(self) -> None:
        """Flush and close the event files."""
        if self.enabled:
            self.writer.close()
