"""Read-ahead on a background thread, for batches and for raw-file blocks alike."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


def prefetched(items: Iterator[T], depth: int) -> Iterator[T]:
    """Runs ``items`` in a daemon thread, ``depth`` ahead of the consumer; re-raises its errors.

    Used for batches (data.loader) and for raw-file blocks in preprocessing (file reads release the GIL).
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_DONE)
        except BaseException as e:  # handed to the consumer
            q.put(e)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        # stop the worker and wait for it: a thread left inside numpy/torch at interpreter exit
        # can abort the process
        stop.set()
        while t.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                pass
            t.join(timeout=0.05)
