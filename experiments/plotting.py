"""What every figure of the reports shares: one color per compared model, log-x axes ticked at the lengths, the
model's name with its real layers (`hybrid (PAPA)`), and PNG output."""

from pathlib import Path

import matplotlib.ticker
from matplotlib.figure import Figure

from experiments.formatting import tokens

COLORS = {"softmax": "C0", "swa": "C1", "swa_matched": "C4", "power": "C2", "hybrid": "C3"}
COLORS |= {"gated_deltanet": "C5", "gla": "C6", "mamba2": "C7"}  # the field's fixed-state mixers


def color(entry: str) -> str | None:
    """The entry's color: its own, or its family's (power_deg4 is drawn like power), else matplotlib's next."""
    return COLORS.get(entry) or COLORS.get(entry.split("_")[0])


def label(model: str, layer_kinds: str) -> str:
    """The model's name and its layers' mixers, e.g. "hybrid (PPPA)"."""
    return f"{model} ({layer_kinds})"


def log_ticks(ax, lengths: list[int]) -> None:
    """Log x axis with a tick at each length, labelled 256, 1k, 64k..."""
    ax.set_xscale("log")
    ax.set_xticks(lengths, [tokens(L) for L in lengths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def save(fig: Figure, path: Path) -> str:
    """Write the figure as a PNG at `path`; returns its file name."""
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path.name
