"""Feature interaction layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _PairwiseDots(torch.autograd.Function):
    """Selected entries of each sample's Gram matrix, with a backward pass made for the CPU.

    Forward: ``(T T^T).flatten(1)[:, pair_index]`` for T (B, V, D). Autograd's own backward would
    zero-fill a (B, V*V) buffer, ``index_add_`` into it and run two batched GEMMs. Here the gradient
    of the whole symmetric Gram matrix is gathered in one ``index_select`` (``sym_index`` sends
    both (i, j) and (j, i) to pair p, and unselected entries to a zero column), and since
    d(T T^T) = dT T^T + T dT^T, dT = (G + G^T) T is one batched GEMM.
    """

    @staticmethod
    def forward(ctx, vectors, pair_index, sym_index, self_interaction):
        ctx.save_for_backward(vectors, sym_index)
        ctx.self_interaction = self_interaction
        gram = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1)  # (B, V*V)
        # gather with an expanded index: 3x faster than index_select along dim 1 for bf16 on CPU
        return gram.gather(1, pair_index.expand(gram.shape[0], -1))  # (B, P)

    @staticmethod
    def backward(ctx, grad_pairs):
        vectors, sym_index = ctx.saved_tensors
        b, v, _ = vectors.shape
        # in float32: index_select along dim 1 is ~4x slower for bf16 than for fp32 on CPU
        work = torch.promote_types(vectors.dtype, torch.float32)
        padded = F.pad(grad_pairs.to(work), (0, 1))  # (B, P + 1), the last column is zero
        grad_gram = padded.index_select(1, sym_index).view(b, v, v)  # (B, V, V), symmetric
        if ctx.self_interaction:
            grad_gram.diagonal(dim1=1, dim2=2).mul_(2.0)  # d<t, t>/dt = 2t
        grad_vectors = torch.bmm(grad_gram, vectors.to(work))  # (B, V, D)
        return grad_vectors.to(vectors.dtype), None, None, None


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
        # for every Gram entry (i, j): the pair it belongs to, or P (a zero column) if none
        sym = torch.full((num_vectors, num_vectors), rows.numel(), dtype=torch.int64)
        sym[rows, cols] = torch.arange(rows.numel())
        sym[cols, rows] = torch.arange(rows.numel())
        self.register_buffer("sym_index", sym.flatten(), persistent=False)
        self.self_interaction = self_interaction
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
        pairs = _PairwiseDots.apply(vectors, self.pair_index, self.sym_index, self.self_interaction)  # (B, P)
        out = pairs if dense is None else torch.cat([dense, pairs.to(dense.dtype)], dim=1)  # (B, D + P)
        return F.pad(out, (0, self.padding))  # (B, D + P + pad)
