"""Host-side prefetch: a background thread fills a small queue with the next batches while the device works."""

import queue
import threading
from collections.abc import Callable, Iterator

from retention.data.base import Batch
from retention.validation import check_int

_DONE = object()


def prefetch(make_batch: Callable[[int], Batch], start: int, stop: int, *, size: int = 2) -> Iterator[Batch]:
    """Yield make_batch(i) for i in [start, stop), computed up to `size` batches ahead in a daemon thread.
    An exception in the thread is raised in the consumer; closing the generator stops the thread."""
    check_int("size", size)
    batches: queue.Queue = queue.Queue(maxsize=size)
    stopped = threading.Event()

    def put(item) -> bool:
        while not stopped.is_set():
            try:
                batches.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work():
        try:
            for i in range(start, stop):
                if not put(make_batch(i)):
                    return
        except Exception as e:  # handed to the consumer, raised there
            put(e)
            return
        put(_DONE)

    thread = threading.Thread(target=work, daemon=True, name="prefetch")
    thread.start()
    try:
        while (item := batches.get()) is not _DONE:
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        stopped.set()
