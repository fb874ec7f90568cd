"""Embedding tables kept on disk for serving (Merlin HPS's role): memory-mapped, hot rows cached.

The checkpoint is opened memory-mapped, so the tables are never read whole: a lookup reads the rows
it needs from the file (through the OS page cache) unless a bounded in-memory cache holds them. The
cache is direct-mapped (row r lives in slot r mod ``cache_rows``), which keeps every lookup a few
vectorised numpy operations; the hot rows of power-law traffic stay in it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ctrkit.models.embeddings import CategoricalEmbeddings, EmbeddingCollection


class CachedMmapEmbeddings(nn.Module):
    """Lookups of an EmbeddingCollection whose flat table stays memory-mapped, with a row cache.

    Args:
        source: the collection (its ``weight`` memory-mapped, from ``load_checkpoint(..., mmap=True)``).
        cache_rows: rows the cache holds (0 disables it).

    Shapes: ids (B, F) int64 -> (B, F, D) float32.
    """

    def __init__(self, source: EmbeddingCollection, cache_rows: int):
        super().__init__()
        if cache_rows < 0:
            raise ValueError(f"--cache-rows must be >= 0, got {cache_rows}")
        self.table = source.weight.detach().numpy()  # (rows, D), file-backed
        self.offsets = source.offsets.numpy()
        self.cardinalities = source.cardinalities
        self.dim = source.dim
        self.cache_rows = cache_rows
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

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = (ids.cpu().numpy() + self.offsets).reshape(-1)  # (B*F,)
        vectors = self.lookup(rows).reshape(ids.shape[0], ids.shape[1], self.dim)
        return torch.from_numpy(vectors).to(ids.device)  # (B, F, D)


def use_mmap_store(model: nn.Module, cache_rows: int) -> list[CachedMmapEmbeddings]:
    """Swaps every one-hot embedding collection of ``model`` for a cached memory-mapped one."""
    stores = []
    for m in model.modules():
        if isinstance(m, CategoricalEmbeddings):
            if m.bags is not None:
                raise ValueError("--embedding-store mmap serves one-hot features; this model has multi-hot ones")
            m.onehot = CachedMmapEmbeddings(m.onehot, cache_rows)
            stores.append(m.onehot)
    return stores
