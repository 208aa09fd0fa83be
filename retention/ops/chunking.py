"""The chunk sizes of the chunked ops (power retention and the matrix-state ops) and the default for a length."""

CHUNK_SIZES = (16, 32, 64, 128, 256, 512, 1024)
"""The `chunk_size` values of the chunked ops (power retention and the matrix-state ops)."""
DEFAULT_CHUNK_SIZE = 128  # fastest measured on CPU at d=64 (experiments/PERF_LOG.md)


def default_chunk_size(T: int, preferred: int = DEFAULT_CHUNK_SIZE) -> int:
    """The chunk an op runs a length in when none is given.

    Args:
        T: the tokens.
        preferred: the op's own chunk for long sequences (power retention: DEFAULT_CHUNK_SIZE).

    Returns:
        `preferred`, or the smallest of CHUNK_SIZES that holds all of a shorter sequence.
    """
    return next((c for c in CHUNK_SIZES if c >= min(T, preferred)), preferred)
