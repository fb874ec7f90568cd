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

    def to_padded(self) -> torch.Tensor:
        """The same bags as a (B, Fm, L) tensor, each bag's ids followed by -1 up to the longest bag's
        length L (at least 1): the rectangular form a server request carries (see PaddedMultiHot)."""
        bags = self.offsets.numel() - 1  # Fm * B
        lengths = self.offsets[1:] - self.offsets[:-1]  # (Fm * B,)
        width = max(int(lengths.max()) if bags else 0, 1)
        out = torch.full((bags, width), -1, dtype=torch.int64, device=self.ids.device)
        bag = torch.repeat_interleave(torch.arange(bags, device=self.ids.device), lengths)  # (nnz,)
        out[bag, torch.arange(self.ids.numel(), device=self.ids.device) - self.offsets[bag]] = self.ids
        return out.view(self.num_features, bags // max(self.num_features, 1), width).transpose(0, 1).contiguous()


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
