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

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MultiHot:
        return MultiHot(
            self.ids.to(device, non_blocking=non_blocking),
            self.offsets.to(device, non_blocking=non_blocking),
            self.num_features,
        )


@dataclass
class Batch:
    """A batch of B samples.

    Attributes:
        dense: (B, n_numerical) float32 numerical features, or None when there are none.
        sparse: (B, F) int64 categorical ids, one column per categorical feature.
        labels: (B,) float32 clicks (0 or 1), or None at inference time.
        multi_hot: the multi-hot categorical features, or None when there are none.
    """

    dense: torch.Tensor | None
    sparse: torch.Tensor
    labels: torch.Tensor | None = None
    multi_hot: MultiHot | None = None

    def __len__(self) -> int:
        return self.sparse.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch on ``device`` (a no-op for tensors already there)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)
        return Batch(move(self.dense), move(self.sparse), move(self.labels), move(self.multi_hot))
