"""Feature interaction layers."""

from __future__ import annotations

import torch
from torch import nn

from ctrkit import native
from ctrkit.models.mlp import normal_init

_NATIVE_KINDS = {  # (dense dtype, embeddings dtype) -> the kernels' suffix (ctrkit/native/interaction.c)
    (torch.float32, torch.float32): "f32",
    (torch.bfloat16, torch.float32): "bf16_f32",
    (torch.bfloat16, torch.bfloat16): "bf16",
}


def _native_kind(dense: torch.Tensor | None, embeddings: torch.Tensor) -> str | None:
    """The native kernels' suffix for these inputs, or None where they do not apply (not on the CPU, other
    dtypes, or no kernels built: ctrkit.native)."""
    kind = _NATIVE_KINDS.get((embeddings.dtype if dense is None else dense.dtype, embeddings.dtype))
    if kind is None or embeddings.device.type != "cpu" or embeddings.dim() != 3:
        return None
    return kind if native.library() is not None else None


class _NativeDotInteractionFn(torch.autograd.Function):
    """The same output and gradients as ``_DotInteractionFn`` from the C kernels in ctrkit/native/interaction.c:
    each sample's vectors read once, its pairs' dots written straight into the output row (no (B, V, D) cat, no
    (B, V*V) Gram matrix and gather), and in backward each vector's gradient summed from the output gradient's row.
    float32 embeddings under a bfloat16 dense vector are rounded to
    bfloat16 inside the kernel, as ``.to(bfloat16)`` rounds them; sums are in float32 in a fixed order per sample
    (the same result at any thread count)."""

    @staticmethod
    def forward(ctx, dense, embeddings, kind, width, self_interaction):
        lib = native.library()
        emb = embeddings.contiguous()  # (B, F, D)
        dense = dense.contiguous() if dense is not None else None  # (B, D)
        b, f, d = emb.shape
        out = emb.new_empty((b, width), dtype=emb.dtype if dense is None else dense.dtype)  # (B, W)
        getattr(lib, f"ctrkit_dot_forward_{kind}")(
            None if dense is None else dense.data_ptr(), emb.data_ptr(), out.data_ptr(), b, f, d, width,
            int(self_interaction),
        )  # fmt: skip
        ctx.save_for_backward(dense, emb)
        ctx.meta = (kind, self_interaction)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        lib = native.library()
        dense, emb = ctx.saved_tensors
        kind, self_interaction = ctx.meta
        b, f, d = emb.shape
        grad_out = grad_out.to(emb.dtype if dense is None else dense.dtype).contiguous()  # (B, W)
        grad_dense = None if dense is None else torch.empty_like(dense)  # (B, D)
        grad_emb = emb.new_empty((b, f, d), dtype=torch.float32)  # (B, F, D): the kernels' sums
        getattr(lib, f"ctrkit_dot_backward_{kind}")(
            grad_out.data_ptr(), None if dense is None else dense.data_ptr(), emb.data_ptr(),
            None if dense is None else grad_dense.data_ptr(), grad_emb.data_ptr(), b, f, d, grad_out.shape[1],
            int(self_interaction),
        )  # fmt: skip
        return grad_dense, grad_emb.to(emb.dtype), None, None, None


class _DotInteractionFn(torch.autograd.Function):
    """[dense, selected Gram entries, zero padding] in one output, with a backward made for the CPU (ATen
    operations: where the native kernels are not built, and on other devices).

    Forward writes straight into one (B, W) buffer instead of concatenating and padding. Autograd's
    own backward would zero-fill a (B, V*V) buffer, ``index_add_`` into it along dim 1 and run two
    batched GEMMs. Here the gradient of the whole symmetric Gram matrix is one ``gather`` from the
    output gradient (``sym_index`` sends both (i, j) and (j, i) to pair p's column), and since
    d(T T^T) = dT T^T + T dT^T, dT = (G + G^T) T is one batched GEMM. On the Criteo-Kaggle DLRM
    shape this took the interaction from about a quarter of a training step to a few percent.
    """

    @staticmethod
    def forward(ctx, dense, embeddings, pair_index, sym_index, self_interaction, padding):
        dtype = embeddings.dtype if dense is None else dense.dtype
        parts = [embeddings.to(dtype)] if dense is None else [dense.unsqueeze(1), embeddings.to(dtype)]
        vectors = torch.cat(parts, dim=1)  # (B, V, D)
        b, _, d = vectors.shape
        gram = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1)  # (B, V*V)
        lead = 0 if dense is None else d
        p = pair_index.numel()
        out = gram.new_empty(b, lead + p + padding)  # (B, W)
        if dense is not None:
            out[:, :d] = dense
        # gather with an expanded index: ~3x faster than index_select along dim 1 for bf16 on CPU
        torch.gather(gram, 1, pair_index.expand(b, -1), out=out[:, lead : lead + p])
        out[:, lead + p :] = 0
        ctx.save_for_backward(vectors, sym_index)
        ctx.meta = (dense is not None, self_interaction, embeddings.dtype, lead)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        vectors, sym_index = ctx.saved_tensors
        has_dense, self_interaction, emb_dtype, lead = ctx.meta
        b, v, _ = vectors.shape
        # float32 at least: gathers along dim 1 are several times slower in bf16 on CPU
        work = torch.promote_types(vectors.dtype, torch.float32)
        grad_out = grad_out.to(work).contiguous()
        grad_gram = grad_out.gather(1, (sym_index + lead).expand(b, -1)).view(b, v, v)  # (B, V, V), symmetric
        diagonal = grad_gram.diagonal(dim1=1, dim2=2)
        if self_interaction:
            diagonal.mul_(2.0)  # d<t, t>/dt = 2t
        else:
            diagonal.zero_()  # the diagonal is not an output
        grad_vectors = torch.bmm(grad_gram, vectors.to(work))  # (B, V, D)
        if not has_dense:
            return None, grad_vectors.to(emb_dtype), None, None, None, None
        grad_dense = grad_vectors[:, 0] + grad_out[:, :lead]  # (B, D)
        return grad_dense.to(vectors.dtype), grad_vectors[:, 1:].to(emb_dtype), None, None, None, None


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
        # index buffers are built on the CPU even under a meta default device (lazy loading for serving)
        rows, cols = torch.tril_indices(num_vectors, num_vectors, offset=0 if self_interaction else -1, device="cpu")
        self.register_buffer("pair_index", rows * num_vectors + cols, persistent=False)
        # for every Gram entry (i, j): the pair it belongs to (the diagonal's is ignored without
        # self-interaction)
        sym = torch.zeros((num_vectors, num_vectors), dtype=torch.int64, device="cpu")
        sym[rows, cols] = torch.arange(rows.numel(), device="cpu")
        sym[cols, rows] = torch.arange(rows.numel(), device="cpu")
        self.register_buffer("sym_index", sym.flatten(), persistent=False)
        self.num_vectors = num_vectors
        self.self_interaction = self_interaction
        self.with_dense = with_dense
        width = (dim if with_dense else 0) + rows.numel()
        self.padding = (-width) % pad_to
        self.out_features = width + self.padding
        self.use_native = True  # training and scoring on the CPU by ctrkit/native's kernels where built (False: ATen)

    def forward(self, dense: torch.Tensor | None, embeddings: torch.Tensor) -> torch.Tensor:
        # the CPU's C kernels (ctrkit/native), in training and in scoring, except under torch.compile, which fuses
        # the ATen ops itself (a ctypes call would break its graph), and in exports: plain ops every exporter knows
        training = torch.is_grad_enabled()
        eager = not torch.compiler.is_compiling() if training else native.scoring_eagerly()
        kind = _native_kind(dense, embeddings) if self.use_native and eager else None
        if kind is not None:
            return _NativeDotInteractionFn.apply(dense, embeddings, kind, self.out_features, self.self_interaction)
        if not training:
            return self._plain(dense, embeddings)
        return _DotInteractionFn.apply(
            dense, embeddings, self.pair_index, self.sym_index, self.self_interaction, self.padding
        )  # (B, D + P + pad)

    def _plain(self, dense: torch.Tensor | None, embeddings: torch.Tensor) -> torch.Tensor:
        """The forward pass without the custom autograd function (same values)."""
        dtype = embeddings.dtype if dense is None else dense.dtype
        parts = [embeddings.to(dtype)] if dense is None else [dense.unsqueeze(1), embeddings.to(dtype)]
        vectors = torch.cat(parts, dim=1)  # (B, V, D)
        gram = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1)  # (B, V*V)
        pairs = gram.gather(1, self.pair_index.expand(gram.shape[0], -1))  # (B, P); faster than index_select on dim 1
        out = [pairs] if dense is None else [dense, pairs]
        if self.padding:
            out.append(pairs.new_zeros(pairs.shape[0], self.padding))
        return torch.cat(out, 1)  # (B, W)


class _CrossNetworkFn(torch.autograd.Function):
    """A stack of cross layers, x_{l+1} = x0 * (V(U x_l) + b) + x_l (or W x_l + b at full rank), forward and
    backward in one function, with fewer passes over (B, d) than autograd makes of the same ops.

    Forward adds and multiplies in one ``addcmul``. Backward accumulates the gradient of x0 over the
    layers with ``addcmul_`` instead of a product and a sum, and adds the matrix path's gradient of x_l to
    the skip path's inside the GEMM (``addmm``) instead of in a separate pass.

    ``weights`` holds per layer (U, V, b), U None at full rank (then V is W).
    """

    @staticmethod
    def forward(ctx, x0, low_rank, *weights):
        layers = [weights[i : i + 3] for i in range(0, len(weights), 3)]
        x, saved = x0, []
        for u, v, b in layers:
            p = x.mm(u.t()) if low_rank else x  # (B, r), or x itself at full rank
            h = torch.addmm(b, p, v.t())  # (B, d)
            saved += [x, p, h] if low_rank else [x, h]
            x = torch.addcmul(x, x0, h)
        ctx.low_rank = low_rank
        ctx.save_for_backward(x0, *weights, *saved)
        return x

    @staticmethod
    def backward(ctx, grad):
        low_rank = ctx.low_rank
        x0, *rest = ctx.saved_tensors
        n = len(rest) // (6 if low_rank else 5)
        weights, saved = rest[: 3 * n], rest[3 * n :]
        per = 3 if low_rank else 2
        grads: list[torch.Tensor | None] = [None] * (3 * n)
        grad_x0 = None
        owned = False  # grad is a buffer of this function's (not autograd's): it may be updated in place
        for i in reversed(range(n)):
            u, v, _ = weights[3 * i : 3 * i + 3]
            x, p, h = saved[per * i : per * i + 3] if low_rank else (saved[2 * i], saved[2 * i], saved[2 * i + 1])
            grad_h = grad * x0  # (B, d)
            grads[3 * i + 1] = grad_h.t().mm(p)  # dV (or dW)
            grads[3 * i + 2] = grad_h.sum(0)  # db
            if grad_x0 is None:
                grad_x0 = grad * h
            else:
                grad_x0.addcmul_(grad, h)
            if low_rank:
                grad_p = grad_h.mm(v)  # (B, r)
                grads[3 * i] = grad_p.t().mm(x)  # dU
                grad_h, v = grad_p, u  # the matrix path's gradient of x_l: grad_p U
            # skip path + matrix path, in place once grad is ours (addmm's out= form: FLOP counters know addmm)
            grad = torch.addmm(grad, grad_h, v, out=grad) if owned else torch.addmm(grad, grad_h, v)
            owned = True
        return (grad_x0.add_(grad), None, *grads)


class CrossLayer(nn.Module):
    """One DCNv2 cross layer: x_{l+1} = x0 * (V(U x_l) + b) + x_l.

    U (d -> r, no bias) and V (r -> d, with bias) form a rank-r factorisation of the d x d weight.
    With ``rank`` 0, or a rank of at least d (which factorises nothing and costs more), the layer is
    full rank: x0 * (W x_l + b) + x_l.

    Shapes: x0 (B, d), x (B, d) -> (B, d).
    """

    def __init__(self, dim: int, rank: int = 0):
        super().__init__()
        self.low_rank = 0 < rank < dim
        if self.low_rank:
            self.down = nn.Linear(dim, rank, bias=False)  # U
            self.up = nn.Linear(rank, dim)  # V, b
        else:
            self.up = nn.Linear(dim, dim)  # W, b
        with torch.no_grad():  # Glorot-normal weights and zero bias, as the DCNv2 reference
            for layer in (self.down, self.up) if self.low_rank else (self.up,):
                fan_out, fan_in = layer.weight.shape
                normal_init(layer.weight, (2.0 / (fan_in + fan_out)) ** 0.5)
            self.up.bias.zero_()

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = self.up(self.down(x)) if self.low_rank else self.up(x)  # (B, d)
        return x0 * h + x


class CrossNetwork(nn.Module):
    """A stack of DCNv2 cross layers over the same x0.

    Args:
        dim: d, the width of x0.
        num_layers: cross layers.
        rank: low-rank projection width r (0: full rank).

    Shapes: x0 (B, d) -> (B, d).
    """

    def __init__(self, dim: int, num_layers: int, rank: int = 0):
        super().__init__()
        self.layers = nn.ModuleList(CrossLayer(dim, rank) for _ in range(num_layers))
        self.out_features = dim

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and not torch.is_autocast_enabled(x0.device.type):
            # training without autocast: the fused forward and backward (same values as the layers')
            low_rank = self.layers[0].low_rank
            weights = []
            for layer in self.layers:
                weights += [layer.down.weight if low_rank else None, layer.up.weight, layer.up.bias]
            return _CrossNetworkFn.apply(x0, low_rank, *weights)
        x = x0  # inference, export and autocast: the layers' own ops
        for layer in self.layers:
            x = layer(x0, x)
        return x
