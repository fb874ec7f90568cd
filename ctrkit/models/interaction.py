"""Feature interaction layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DotInteraction(nn.Module):
    """DLRM's interaction: pairwise dot products of the dense vector and all embeddings.

    With V = F + 1 vectors of width D (the bottom-MLP output first), the output is the dense vector
    followed by the V(V-1)/2 dot products of distinct pairs (V(V+1)/2 with ``self_interaction``),
    zero-padded so the width is a multiple of ``pad_to`` (NVIDIA pads to 8 so the top MLP's first
    GEMM is aligned).

    Args:
        num_vectors: V, the number of vectors (categorical features + 1).
        dim: D.
        self_interaction: include each vector's dot with itself.
        pad_to: round the output width up to a multiple of this (1 disables padding).
        with_dense: a dense vector is passed (False for models without numerical features, where
            V = F and the output holds only the pairwise dots).

    Shapes: dense (B, D) or None, embeddings (B, F, D) -> (B, out_features).
    """

    def __init__(
        self, num_vectors: int, dim: int, self_interaction: bool = False, pad_to: int = 8, with_dense: bool = True
    ):
        super().__init__()
        rows, cols = torch.tril_indices(num_vectors, num_vectors, offset=0 if self_interaction else -1)
        self.register_buffer("pair_index", rows * num_vectors + cols, persistent=False)
        self.num_vectors = num_vectors
        self.with_dense = with_dense
        width = (dim if with_dense else 0) + rows.numel()
        self.padding = (-width) % pad_to
        self.out_features = width + self.padding

    def forward(self, dense: torch.Tensor | None, embeddings: torch.Tensor) -> torch.Tensor:
        if dense is None:  # no numerical features: the embeddings interact among themselves
            vectors = embeddings  # (B, F, D)
        else:
            vectors = torch.cat([dense.unsqueeze(1), embeddings.to(dense.dtype)], dim=1)  # (B, V, D)
        gram = torch.bmm(vectors, vectors.transpose(1, 2))  # (B, V, V)
        pairs = gram.flatten(1).index_select(1, self.pair_index)  # (B, P)
        out = pairs if dense is None else torch.cat([dense, pairs], dim=1)  # (B, D + P)
        return F.pad(out, (0, self.padding))  # (B, D + P + pad)
