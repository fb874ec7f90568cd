"""The one batch type that flows from the loader through trainer, evaluator and server."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """A batch of B samples.

    Attributes:
        dense: (B, n_numerical) float32 numerical features, or None when there are none.
        sparse: (B, F) int64 categorical ids, one column per categorical feature.
        labels: (B,) float32 clicks (0 or 1), or None at inference time.
    """

    dense: torch.Tensor | None
    sparse: torch.Tensor
    labels: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.sparse.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch on ``device`` (a no-op for tensors already there)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)
        return Batch(move(self.dense), move(self.sparse), move(self.labels))

    def pin_memory(self) -> Batch:
        pin = lambda t: None if t is None else t.pin_memory()
        return Batch(pin(self.dense), pin(self.sparse), pin(self.labels))
