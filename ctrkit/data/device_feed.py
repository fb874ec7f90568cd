"""Batches fed to the device that trains on them, each batch's copy overlapping the step before it.

On a GPU (``DeviceFeed``): the loader reads each batch in the files' own dtypes (``SplitBinaryDataset.slice``
with ``narrow``: int32 ids and float16 numerical features for the seeds' datasets, half the bytes of int64 and
float32 or less) and, on its prefetch thread, into page-locked memory (``Batch.pin_memory``: torch's caching host
allocator hands the same blocks back batch after batch). The feed queues batch k+1's copy on a side CUDA stream,
widens it there (``Batch.widened``: exact), and only then hands batch k to the step, so the copy runs while the
step computes; the step's stream waits for the copy's event, never the host. On a CPU a batch is used where it
was read, as wide as the models take it: the feed hands it on.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ctrkit.data.batch import Batch


def narrow_on(device: torch.device | str) -> bool:
    """Whether batches for ``device`` are read narrow and pinned (a GPU) or wide where they are used (a CPU)."""
    return torch.device(device).type == "cuda"


class DeviceFeed:
    """Hands a loader's batches to ``device``: on a GPU, each batch copied and widened on a side stream one batch
    ahead (the module docstring says how); elsewhere, the batches as they are, widened where they are narrow."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __call__(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """``batches`` on the device, in order; closing the feed closes ``batches`` (a loader's prefetch thread)."""
        try:
            if self.stream is None:
                for batch in batches:
                    yield batch.widened().to(self.device)
                return
            ahead = self._send(next(batches, None))
            while ahead is not None:
                batch, copied = ahead
                ahead = self._send(next(batches, None))  # the next copy is queued before this batch's step
                current = torch.cuda.current_stream(self.device)
                current.wait_event(copied)
                for t in batch.tensors():  # made on the side stream, used on this one: not reused before
                    t.record_stream(current)
                yield batch
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def _send(self, batch: Batch | None) -> tuple[Batch, torch.cuda.Event] | None:
        """Queues ``batch``'s copy to the device and its widening on the side stream; returns the device batch and
        the event that marks them done."""
        if batch is None:
            return None
        with torch.cuda.stream(self.stream):
            moved = batch.to(self.device, non_blocking=True).widened()
            copied = torch.cuda.Event()
            copied.record(self.stream)
        return moved, copied
