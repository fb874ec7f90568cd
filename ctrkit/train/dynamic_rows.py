"""Rows of dynamic tables newly given to an id (``models/dynamic.py``): weights and optimizer state reset."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ctrkit.distributed.sharded_embeddings import ShardedEmbeddingCollection
from ctrkit.models.embeddings import EmbeddingCollection
from ctrkit.train.optim import SparseRowOptimizer


@torch.no_grad()
def reset_table_rows(
    model: nn.Module, optimizers: Sequence[torch.optim.Optimizer], fresh: dict[int, np.ndarray]
) -> None:
    """Newly admitted rows of dynamic features (one-hot column -> rows): weights copied from their table's rare
    row (row 0), optimizer state rows as a new table's; in a hybrid-parallel job, each rank its own shards'."""
    if not fresh:
        return
    for m in model.modules():
        if not isinstance(m, (EmbeddingCollection, ShardedEmbeddingCollection)):  # the one-hot tables (``features``)
            continue
        columns = [c for c in sorted(fresh) if c in m.features]
        if not columns:
            continue
        if isinstance(m, ShardedEmbeddingCollection):  # (parameter, its rows, their values) of this rank's shards
            pieces = m.admitted_rows({m.features.index(c): fresh[c] for c in columns})
        else:  # an EmbeddingCollection: the flat table
            pieces = []
            for c in columns:
                base = int(m.offsets[m.features.index(c)])  # type: ignore[index]  # (a buffer: a Tensor)
                flat = torch.from_numpy(fresh[c] + base).to(m.weight.device)
                pieces.append((m.weight, flat, m.weight[base].clone()))
        for weight, rows, values in pieces:
            weight[rows] = values.expand(len(rows), -1)
            for opt in optimizers:
                record = opt.record if isinstance(opt, SparseRowOptimizer) else None
                for key, value in (opt.state.get(weight) or {}).items():
                    if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == weight.shape[0]:
                        value[rows] = record.initial(key) if record is not None else 0
