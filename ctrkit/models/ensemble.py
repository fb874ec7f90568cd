"""Several models of one architecture served as one: their logits averaged.

What ``train`` keeps when a snapshot ensemble of its epochs' best models scores higher on validation than
the best single model (``TrainConfig.snapshot_ensemble``); checkpoints store it as the members' weights
(``Checkpoint.snapshots`` and ``Checkpoint.ensemble``), and evaluation, prediction, export and serving run
it like any model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class Ensemble(nn.Module):
    """The mean of its members' logits.

    Args:
        members: models taking the same inputs (built from one config).

    Shapes: those of the members' forward: numerical (B, N), categorical (B, F), multi_hot or None in;
    logits (B,) out.
    """

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)

    def forward(self, numerical: torch.Tensor | None, categorical: torch.Tensor, multi_hot=None) -> torch.Tensor:
        total = self.members[0](numerical, categorical, multi_hot)
        for member in self.members[1:]:
            total = total + member(numerical, categorical, multi_hot)
        return total / len(self.members)
