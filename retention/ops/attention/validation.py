"""The softmax-attention ops' own argument checks and the values they allow (the shared q, k, v and scale checks are
in `retention/ops/validation.py`)."""

from retention.validation import check_int

ATTENTION_IMPLS = ("auto", "xla", "cudnn", "reference", "splash")
"""The `impl` values of `softmax_attention`."""


def check_window(window) -> None:
    """window is None (full causal attention) or an int >= 1 (a sliding window of that many tokens)."""
    if window is not None:
        check_int("window", window)
