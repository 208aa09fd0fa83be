"""Human-readable sizes and tables for the benchmarks: bytes (512 B, 145 KiB, 32.4 MiB, 1.8 GiB), token counts
(256, 1.5k, 64k, 1M), ratios (0.52x, 94x) and Markdown tables."""


def human_bytes(n: float) -> str:
    """Bytes in B or KiB (whole numbers), MiB or GiB (one decimal), with thousands separators."""
    if n < 2**10:
        return f"{n:,.0f} B"
    if n < 2**20:
        return f"{n / 2**10:,.0f} KiB"
    if n < 2**30:
        return f"{n / 2**20:,.1f} MiB"
    return f"{n / 2**30:,.1f} GiB"


def tokens(n: int) -> str:
    """A token count as 256, 1.5k, 64k or 1M (binary thousands: 1k = 1024)."""
    if n >= 2**20:
        return f"{n / 2**20:g}M"
    if n >= 2**10:
        return f"{n / 2**10:g}k"
    return str(n)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; every column after the first right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def times(ratio: float) -> str:
    """A ratio as 0.52x, 6.7x or 94x."""
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2g}x"
