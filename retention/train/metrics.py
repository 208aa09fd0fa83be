"""TensorBoard logging (tensorboardX) and the throughput arithmetic behind tokens/s and achieved FLOP/s."""

import os

from tensorboardX import SummaryWriter

from retention.nn import LMConfig, flops_per_token


def training_flops_per_token(config: LMConfig, seq_len: int) -> float:
    """Training FLOPs per token: 3x the forward (the backward costs about twice the forward)."""
    return 3 * flops_per_token(config, seq_len)


def throughput(tokens: int, seconds: float, flops_per_tok: float, peak_flops: float) -> dict[str, float]:
    """tokens/s, achieved FLOP/s and its fraction of `peak_flops` for `tokens` processed in `seconds`."""
    tokens_per_s = tokens / max(seconds, 1e-12)
    flops = tokens_per_s * flops_per_tok
    return {"tokens_per_s": tokens_per_s, "flops_per_s": flops, "peak_fraction": flops / peak_flops}


class MetricsWriter:
    """Scalars and the hparams summary under `logdir`; `purge_step` drops events a killed run wrote past it."""

    def __init__(self, logdir: str, *, purge_step: int | None = None, enabled: bool = True):
        """enabled=False (a multi-host job's other processes): every call does nothing."""
        self.enabled = enabled
        if enabled:
            os.makedirs(logdir, exist_ok=True)
            self.writer = SummaryWriter(logdir, purge_step=purge_step)

    def scalars(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        """One scalar per entry, tagged `prefix/name`."""
        if not self.enabled:
            return
        for name, value in values.items():
            self.writer.add_scalar(f"{prefix}/{name}" if prefix else name, float(value), step)

    def hparams(self, hparams: dict, metrics: dict[str, float]) -> None:
        """The run's hyperparameters and final metrics, for TensorBoard's HParams tab (a sweep's runs side by side)."""
        if not self.enabled:
            return
        clean = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
        self.writer.add_hparams(clean, {f"hparam/{k}": float(v) for k, v in metrics.items()}, name="hparams")

    def close(self) -> None:
        """Flush and close the event files."""
        if self.enabled:
            self.writer.close()
