"""The one batch type that flows from the loader through trainer, evaluator and server."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MultiHot:
    """The ids of Fm multi-hot features for B samples, as feature-major bags.

    Bag ``f * B + b`` holds sample b's ids of feature f: ``ids[offsets[f * B + b]:offsets[f * B + b + 1]]``.
    Each feature's ids for a contiguous slice of samples are contiguous on disk, so the bags are
    built without any per-sample work.

    Attributes:
        ids: (nnz,) int64 ids, each in its own feature's range.
        offsets: (Fm * B + 1,) int64 bag boundaries.
        num_features: Fm.
    """

    ids: torch.Tensor
    offsets: torch.Tensor
    num_features: int

    def rows(self, start: int, stop: int, size: int) -> MultiHot:
        """Samples ``start:stop`` of the ``size`` these bags hold: each feature's bags of those samples."""
        ids, bounds, base = [], [], 0
        for f in range(self.num_features):
            offsets = self.offsets[f * size + start : f * size + stop + 1]
            first, last = int(offsets[0]), int(offsets[-1])
            ids.append(self.ids[first:last])
            bounds.append(offsets[:-1] - (first - base))
            base += last - first
        bounds.append(torch.tensor([base], dtype=self.offsets.dtype, device=self.offsets.device))
        return MultiHot(torch.cat(ids), torch.cat(bounds), self.num_features)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MultiHot:
        return MultiHot(
            self.ids.to(device, non_blocking=non_blocking),
            self.offsets.to(device, non_blocking=non_blocking),
            self.num_features,
        )

    def pin_memory(self) -> MultiHot:
        return MultiHot(self.ids.pin_memory(), self.offsets.pin_memory(), self.num_features)


@dataclass(frozen=True)
class PaddedMultiHot:
    """Multi-hot ids as a rectangle: ``ids[b, f]`` holds sample b's ids of feature f, then -1 padding.

    Every negative entry is padding: it adds nothing to the bag and does not count towards a mean.
    The form servers take (KServe v2 tensors are rectangular) and exports trace (plain gathers and
    sums, which every runtime has); pooling it equals pooling the same bags as a MultiHot.

    Attributes:
        ids: (B, Fm, L) int64.
    """

    ids: torch.Tensor


@dataclass
class Batch:
    """A batch of B samples.

    Attributes:
        numerical: (B, N) float32 numerical features, or None when there are none.
        categorical: (B, F) int64 ids, one column per one-hot categorical feature.
        labels: (B,) float32 clicks (0 or 1), or None at inference time.
        multi_hot: the multi-hot categorical features, or None when there are none.
    """

    numerical: torch.Tensor | None
    categorical: torch.Tensor
    labels: torch.Tensor | None = None
    multi_hot: MultiHot | None = None

    def __len__(self) -> int:
        return self.categorical.shape[0]

    def rows(self, s: slice) -> Batch:
        """Samples ``s`` (a slice of consecutive samples) as a batch of their own."""
        start, stop, _ = s.indices(len(self))
        pick = lambda t: None if t is None else t[start:stop]
        multi_hot = self.multi_hot
        if isinstance(multi_hot, PaddedMultiHot):
            multi_hot = PaddedMultiHot(multi_hot.ids[start:stop])
        elif multi_hot is not None:
            multi_hot = multi_hot.rows(start, stop, len(self))
        return Batch(pick(self.numerical), self.categorical[start:stop], pick(self.labels), multi_hot)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch on ``device`` (a no-op for tensors already there)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)
        categorical = self.categorical.to(device, non_blocking=non_blocking)
        return Batch(move(self.numerical), categorical, move(self.labels), move(self.multi_hot))

    def widened(self) -> Batch:
        """The batch in the dtypes models take (int64 ids, float32 numerical features and labels), where it holds
        the files' own (``SplitBinaryDataset.slice(narrow=True)``); widening is exact. A no-op where it is wide."""
        wide = lambda t, dtype: None if t is None or t.dtype == dtype else t.to(dtype)  # noqa: E731
        numerical, labels = wide(self.numerical, torch.float32), wide(self.labels, torch.float32)
        categorical = wide(self.categorical, torch.int64)
        if numerical is None and labels is None and categorical is None:
            return self
        return Batch(
            self.numerical if numerical is None else numerical,
            self.categorical if categorical is None else categorical,
            self.labels if labels is None else labels,
            self.multi_hot,
        )

    def pin_memory(self) -> Batch:
        """The same batch in page-locked memory (torch's caching host allocator reuses the blocks of batches freed
        once their copies are done), so a copy to a GPU can be asynchronous."""
        pin = lambda t: None if t is None else t.pin_memory()  # noqa: E731
        return Batch(pin(self.numerical), self.categorical.pin_memory(), pin(self.labels), pin(self.multi_hot))

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the batch."""
        out = [t for t in (self.numerical, self.categorical, self.labels) if t is not None]
        if isinstance(self.multi_hot, PaddedMultiHot):
            out.append(self.multi_hot.ids)
        elif self.multi_hot is not None:
            out += [self.multi_hot.ids, self.multi_hot.offsets]
        return out
