"""Progress of the long data steps (training a tokenizer, tokenising a split) in bytes of text, as the trainer's
step display does it: a tqdm bar on a terminal, elsewhere a log line every LOG_EVERY_S seconds, so a log file gets
no bar frames; a last line says the bytes done, the seconds and the rate."""

import logging
import sys
import time
from collections.abc import Iterable, Iterator

log = logging.getLogger(__name__)
LOG_EVERY_S = 30.0  # off a terminal: seconds between progress lines
MB = 1e6


def utf8_bytes(text: str) -> int:
    """The UTF-8 bytes of `text` (its length when ASCII, with no copy)."""
    return len(text) if text.isascii() else len(text.encode())


class Meter:
    """Bytes of text done by a step called `what`, out of `total` when known; on a terminal `stream` (default
    stderr) a tqdm bar, elsewhere a log line at most every `every_s` seconds; `close` logs the last line."""

    def __init__(self, what: str, total: int | None = None, *, stream=None, every_s=None, clock=time.monotonic):
        stream = sys.stderr if stream is None else stream
        self.what, self.total, self.done, self.clock = what, total, 0, clock
        self.every_s = LOG_EVERY_S if every_s is None else every_s
        self.start = self.last_line = clock()
        self.bar = None
        if stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=what, file=stream, unit="B", unit_scale=True, dynamic_ncols=True)

    def update(self, n: int) -> None:
        """n more bytes done."""
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif (now := self.clock()) - self.last_line >= self.every_s:
            self.last_line = now
            rate = self.done / MB / max(now - self.start, 1e-9)
            of = "" if self.total is None else f" of {self.total / MB:.1f}"
            log.info("%s: %.1f%s MB, %.1f MB/s", self.what, self.done / MB, of, rate)

    def texts(self, texts: Iterable[str]) -> Iterator[str]:
        """Each of `texts`, counting its UTF-8 bytes as it passes."""
        for text in texts:
            yield text
            self.update(utf8_bytes(text))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        seconds = self.clock() - self.start
        log.info("%s: %.1f MB in %.1f s", self.what, self.done / MB, seconds)

    def __enter__(self) -> "Meter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
