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
        return Batch(move(self.numerical), move(self.categorical), move(self.labels), move(self.multi_hot))
