"""Batching: contiguous slices of a dataset, shuffled batch order per epoch, background prefetch."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ctrkit.data.batch import Batch
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.prefetch import prefetched


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
        part: (rank, world size) in hybrid-parallel runs: every batch is the same global batch on
            every rank, and this rank reads only its contiguous share of it (``part_bounds``).
        narrow: read each batch in the files' own dtypes into page-locked memory, for a GPU to copy
            asynchronously and widen (``device_feed.DeviceFeed``).
    """

    def __init__(
        self,
        dataset: SplitBinaryDataset,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        prefetch: int = 2,
        part: tuple[int, int] | None = None,
        narrow: bool = False,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        if part is not None and not 0 <= part[0] < part[1]:
            raise ValueError(f"part must be (rank, world size) with 0 <= rank < world size, got {part}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.prefetch = prefetch
        self.part = part
        self.narrow = narrow

    def __len__(self) -> int:
        return -(-len(self.dataset) // self.batch_size)

    def batch_order(self, epoch: int) -> np.ndarray:
        """Indices of the batches of ``epoch`` in the order they are served."""
        order = np.arange(len(self), dtype=np.int64)
        if self.shuffle:
            np.random.default_rng([self.seed, epoch]).shuffle(order)
        return order

    def global_bounds(self, i: int) -> tuple[int, int]:
        """Sample range [lo, hi) of batch ``i`` of the whole job (before any split over ranks)."""
        lo = i * self.batch_size
        return lo, min(lo + self.batch_size, len(self.dataset))

    def epoch(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        """Batches of ``epoch``, skipping its first ``start`` (to resume mid-epoch)."""
        order = self.batch_order(epoch)[start:]

        def make(i: int) -> Batch:
            lo, hi = self.global_bounds(int(i))
            if self.part is not None:
                lo, hi = part_bounds(lo, hi, *self.part)
            if self.narrow:
                return self.dataset.slice(lo, hi, narrow=True).pin_memory()
            return self.dataset.slice(lo, hi)

        if self.prefetch <= 0:
            for i in order:
                yield make(i)
            return
        yield from prefetched((make(i) for i in order), self.prefetch)

    def __iter__(self) -> Iterator[Batch]:
        return self.epoch(0)


def part_bounds(lo: int, hi: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous share of samples [lo, hi): sizes differ by at most one."""
    n = hi - lo
    return lo + n * rank // world, lo + n * (rank + 1) // world
