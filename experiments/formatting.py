"""Human-readable sizes for the benchmarks' tables: bytes (512 B, 145 KiB, 32.4 MiB, 1.8 GiB) and token counts
(256, 1.5k, 64k, 1M)."""


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
