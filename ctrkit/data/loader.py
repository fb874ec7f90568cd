"""Batching: contiguous slices of a dataset, shuffled batch order per epoch, background prefetch."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import numpy as np

from ctrkit.data.batch import Batch
from ctrkit.data.dataset import SplitBinaryDataset


class BatchLoader:
    """Yields Batches of contiguous samples.

    Reading contiguous slices keeps the memory-mapped reads sequential; shuffling the *order of
    batches* each epoch is what NVIDIA's DLRM does and costs nothing. The order of epoch ``e`` is a
    pure function of ``(seed, e)``, so a resumed run sees exactly the batches it would have seen.

    Args:
        dataset: the dataset to slice.
        batch_size: samples per batch; the last batch may be smaller and is kept.
        shuffle: shuffle batch order per epoch (training) or not (evaluation).
        seed: base seed of the shuffle.
        prefetch: batches to prepare ahead in a background thread (0 disables the thread).
    """

    def __init__(
        self, dataset: SplitBinaryDataset, batch_size: int, shuffle: bool = False, seed: int = 0, prefetch: int = 2
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.prefetch = prefetch

    def __len__(self) -> int:
        return -(-len(self.dataset) // self.batch_size)

    def batch_order(self, epoch: int) -> np.ndarray:
        """Indices of the batches of ``epoch`` in the order they are served."""
        order = np.arange(len(self), dtype=np.int64)
        if self.shuffle:
            np.random.default_rng([self.seed, epoch]).shuffle(order)
        return order

    def epoch(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        """Batches of ``epoch``, skipping its first ``start`` (to resume mid-epoch)."""
        order = self.batch_order(epoch)[start:]
        n = len(self.dataset)

        def make(i: int) -> Batch:
            lo = int(i) * self.batch_size
            return self.dataset.slice(lo, min(lo + self.batch_size, n))

        if self.prefetch <= 0:
            for i in order:
                yield make(i)
            return
        yield from _prefetched((make(i) for i in order), self.prefetch)

    def __iter__(self) -> Iterator[Batch]:
        return self.epoch(0)


_DONE = object()


def _prefetched(items: Iterator[Batch], depth: int) -> Iterator[Batch]:
    """Runs ``items`` in a daemon thread, ``depth`` ahead of the consumer; re-raises its errors."""
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
