"""What every figure of the reports shares: one color per compared model, log-x axes ticked at the lengths, the
model's name with its real layers (`hybrid (PAPA)`), and PNG output."""

import zlib
from pathlib import Path

import matplotlib.ticker
from matplotlib.figure import Figure

from experiments.formatting import tokens

COLORS = {"softmax": "C0", "swa": "C1", "swa_matched": "C4", "power": "C2", "hybrid": "C3"}
COLORS |= {"gated_deltanet": "C5", "gla": "C6", "mamba2": "C7"}  # the field's fixed-state mixers


VARIANT_LINES = ("--", ":", "-.")  # a family's variants (power_rope, gated_deltanet_long) in its color


def family(entry: str) -> str | None:
    """The compared model an entry varies: the longest name of COLORS it is or starts with at a "_" (power_deg4 and
    power_rope_const are power's, gated_deltanet_long is gated_deltanet's), None for another model."""
    names = [name for name in COLORS if entry == name or entry.startswith(name + "_")]
    return max(names, key=len, default=None)


def color(entry: str) -> str | None:
    """The entry's color: its family's (`family`), else None (matplotlib's next)."""
    return COLORS.get(family(entry))


def line_style(entry: str) -> dict:
    """How every figure draws the entry: its family's color, a solid line for the family's own entry and one of
    VARIANT_LINES (fixed by the variant's name) for a variant, so a family's variants stay apart."""
    name = family(entry)
    if name is None or name == entry:
        return {"color": color(entry), "linestyle": "-"}
    suffix = entry.removeprefix(name + "_")
    return {"color": color(entry), "linestyle": VARIANT_LINES[zlib.crc32(suffix.encode()) % len(VARIANT_LINES)]}


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
