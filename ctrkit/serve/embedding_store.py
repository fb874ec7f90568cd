"""Embedding tables kept on disk for serving (Merlin HPS's role): memory-mapped, hot rows cached.

The checkpoint is opened memory-mapped, so the tables are never read whole: a lookup reads the rows
it needs from the file (through the OS page cache) unless a bounded in-memory cache holds them. The
cache is direct-mapped (row r lives in slot r mod ``cache_rows``), which keeps every lookup a few
vectorised numpy operations; the hot rows of power-law traffic stay in it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ctrkit.data.batch import PaddedMultiHot
from ctrkit.models.embeddings import CategoricalEmbeddings, EmbeddingBagCollection, EmbeddingCollection, pool_padded


class CachedMmapEmbeddings(nn.Module):
    """Lookups of an EmbeddingCollection whose flat table stays memory-mapped, with a row cache.

    Args:
        source: the collection (its ``weight`` memory-mapped, from ``load_checkpoint(..., mmap=True)``).
        cache_rows: rows the cache holds (0 disables it); at most the table's rows (slot r mod ``cache_rows``: a
            larger cache would hold slots no row maps to).
        table: where the rows are read instead of ``source.weight`` (a sharded checkpoint's
            ``ShardedTableView``: rows indexed by a 1-D array).

    Shapes: ids (B, F) int64 -> (B, F, D) float32.
    """

    def __init__(self, source: EmbeddingCollection | EmbeddingBagCollection, cache_rows: int, table: Any = None):
        super().__init__()
        if cache_rows < 0:
            raise ValueError(f"`cache_rows` must be >= 0, got {cache_rows}")
        self.table = source.weight.detach().numpy() if table is None else table  # (rows, D), file-backed
        self.offsets = source.offsets.numpy()
        self.cardinalities = source.cardinalities
        self.dim = source.dim
        self.cache_rows = cache_rows = min(cache_rows, len(self.table))
        self.tags = np.full(cache_rows, -1, dtype=np.int64)  # which row each slot holds
        self.cache = np.zeros((cache_rows, self.dim), dtype=self.table.dtype)
        self.hits = self.misses = 0

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        """Vectors of flat table ``rows`` (N,) -> (N, D)."""
        if self.cache_rows == 0:
            self.misses += len(rows)
            return self.table[rows]
        slots = rows % self.cache_rows
        hit = self.tags[slots] == rows
        out = np.empty((len(rows), self.dim), dtype=self.table.dtype)
        out[hit] = self.cache[slots[hit]]
        miss = ~hit
        if miss.any():
            wanted = rows[miss]
            vectors = self.table[wanted]  # reads only these rows from the file
            out[miss] = vectors
            self.cache[slots[miss]] = vectors
            self.tags[slots[miss]] = wanted
        self.hits += int(hit.sum())
        self.misses += int(miss.sum())
        return out

    @torch._disable_dynamo  # numpy and file reads: torch.compile compiles around it (torch._dynamo imported on a call)
    def vectors(self, rows: torch.Tensor) -> torch.Tensor:
        """Flat table ``rows`` (any shape) -> their vectors (shape + (D,))."""
        found = self.lookup(rows.cpu().numpy().reshape(-1)).reshape(*rows.shape, self.dim)
        return torch.from_numpy(found).to(rows.device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.vectors(ids + torch.from_numpy(self.offsets).to(ids.device))  # (B, F, D)


class CachedMmapBags(CachedMmapEmbeddings):
    """An EmbeddingBagCollection's pooling over a memory-mapped, cached table (padded bags, as served).

    Shapes: PaddedMultiHot (B, Fm, L) -> (B, Fm, D) float32.
    """

    def __init__(self, source: EmbeddingBagCollection, cache_rows: int, table: Any = None):
        super().__init__(source, cache_rows, table)
        self.is_mean = source.is_mean

    def forward(self, multi_hot: PaddedMultiHot) -> torch.Tensor:
        if not isinstance(multi_hot, PaddedMultiHot):
            raise TypeError("the memory-mapped store serves padded bags (PaddedMultiHot), not training batches")
        offsets = torch.from_numpy(self.offsets).to(multi_hot.ids.device)
        return pool_padded(multi_hot.ids, offsets, self.is_mean, self.vectors)


def use_mmap_store(
    model: nn.Module, cache_rows: int, tables: dict[str, Any] | None = None
) -> list[CachedMmapEmbeddings]:
    """Swaps every embedding collection of ``model`` (one-hot and multi-hot) for a cached memory-mapped one.

    ``tables``: flat tables to read instead of the collections' weights, by module path (a sharded
    checkpoint's views, see ``checkpoint.sharded_table_views``)."""
    tables = tables or {}
    stores = []
    for name, m in list(model.named_modules()):
        if isinstance(m, CategoricalEmbeddings):
            where = f"{name}." if name else ""
            if m.onehot is not None:  # None: a per-width group of multi-hot features only
                m.onehot = CachedMmapEmbeddings(m.onehot, cache_rows, tables.get(f"{where}onehot"))
                stores.append(m.onehot)
            if m.bags is not None:
                m.bags = CachedMmapBags(m.bags, cache_rows, tables.get(f"{where}bags"))
                stores.append(m.bags)
    return stores
