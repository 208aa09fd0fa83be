"""How a trained model reads rows of L tokens at long context, each row one sequence from its start, two ways that
give the same masked sums (the trainer's `masked_sums`, per-position ones included):

- "forward": one full forward, compiled once for [batch, L] (`compare.evaluate.compiled_forward`). Nothing in it is
  quadratic in memory: softmax and window layers run blockwise (online softmax; cuDNN's flash kernel for bf16 on
  GPU), the fixed-state layers (P, D, G, M) their chunked forms, linear in L. Its cost is XLA's estimate of the
  compiled program's bytes (`forward_bytes`).
- "carry": a prefill of the first `segment` tokens, then decode steps of `segment` tokens, each continuing the
  caches the tokens before it left (`compare.evaluate.decode_sums`): a fixed-size state for the fixed-state layers,
  the keys and values for softmax (a cache of L slots, read blockwise) and a ring buffer for a window. Only one
  segment's activations are live at once.
"auto" compiles the forward and keeps it when XLA's estimate is at most `max_bytes`, else reads by "carry". Either
way `cache_bytes` is what the model carries at L: its decode caches for one row (`decode_cache_bytes`).
"""

import dataclasses
import time
from collections.abc import Callable

from flax import nnx

from experiments.compare.evaluate import compiled_forward, decode_sums
from retention.nn import LM, decode_cache_bytes
from retention.validation import check_choice, check_int, check_number

PATHS = ("auto", "forward", "carry")
SEGMENT = 4096  # tokens per decode step on the "carry" path


@dataclasses.dataclass(frozen=True)
class Reader:
    """One model's way through [batch, L] rows; `sums(inputs_BT, targets_BT)` gives their masked sums."""

    model: LM
    batch: int
    length: int
    path: str  # "forward" or "carry"
    segment: int  # the carry path's decode step (tokens)
    forward: Callable | None  # the compiled forward (path "forward"), else None
    forward_bytes: int | None  # XLA's estimate of the compiled forward's bytes; None when it was not compiled
    compile_seconds: float  # compiling the forward (the carry path compiles on its first row)

    def sums(self, inputs_BT, targets_BT) -> dict:
        """The masked sums of `inputs_BT` [batch, L] with next-token `targets_BT` [batch, L] (IGNORE unlabelled).

        Args:
            inputs_BT: int32 token ids, each row a sequence from its start.
            targets_BT: int32 targets.

        Returns:
            `masked_sums`' dict: nll, correct, labels, exact, rows, nll_T [L], labels_T [L] (device arrays).
        """
        if inputs_BT.shape != (self.batch, self.length) or targets_BT.shape != inputs_BT.shape:
            raise ValueError(
                f"inputs and targets must be [{self.batch}, {self.length}] (this reader's rows), got "
                f"{inputs_BT.shape} and {targets_BT.shape}"
            )
        if self.path == "forward":
            return self.forward(nnx.state(self.model), inputs_BT, targets_BT)
        return decode_sums(self.model, inputs_BT, targets_BT, self.segment)

    def cost(self) -> dict:
        """What reading costs in memory: the path, the carry segment, the forward's bytes, the caches at L."""
        return {
            "path": self.path,
            "segment": self.segment if self.path == "carry" else None,
            "forward_bytes": self.forward_bytes,
            "compile_seconds": self.compile_seconds,
            "cache_bytes": decode_cache_bytes(self.model.config, 1, self.length),
        }


def make_reader(
    model: LM, batch: int, length: int, *, path: str = "auto", segment: int = SEGMENT, max_bytes: float = 2**40
) -> Reader:
    """The reader of `model` for [batch, length] rows by `path` (module docstring).

    Args:
        model: the trained LM.
        batch: rows per call.
        length: tokens per row (L).
        path: "auto", "forward" or "carry".
        segment: tokens per decode step on the carry path (cut to L when longer).
        max_bytes: "auto" reads by carry when the compiled forward's XLA estimate is above this.

    Returns:
        The Reader (its forward compiled unless the path is "carry").
    """
    check_int("batch", batch)
    check_int("length", length)
    check_choice("path", path, PATHS)
    check_int("segment", segment)
    check_number("max_bytes", max_bytes, low=0, open_low=True)
    segment = min(segment, length)
    if path == "carry":
        return Reader(model, batch, length, "carry", segment, None, None, 0.0)
    start = time.perf_counter()
    compiled, nbytes = compiled_forward(*nnx.split(model), batch, length)
    seconds = time.perf_counter() - start
    if path == "auto" and nbytes > max_bytes:
        return Reader(model, batch, length, "carry", segment, None, nbytes, seconds)
    return Reader(model, batch, length, "forward", segment, compiled, nbytes, seconds)
