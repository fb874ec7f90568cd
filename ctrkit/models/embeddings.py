"""All categorical embedding tables as one flat table with per-feature row offsets."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ctrkit import hugepages, native
from ctrkit.data.batch import PaddedMultiHot
from ctrkit.models import tiered_tables
from ctrkit.models.storage import IN_MEMORY, TableStorage
from ctrkit.models.table_draw import TableInit


def fill_pending_tables(model: nn.Module) -> None:
    """Draws the tables built ``fill_later`` (``storage.TableStorage``) that nothing has written since."""
    for module in model.modules():
        if isinstance(module, _Tables) and module.pending_fill:
            module.reset_tables()


def tables_written(module: nn.Module) -> None:
    """Records that ``module``'s tables were written whole (the first-order tables, zeroed at construction, which
    the warm start then writes): not drawn later."""
    if isinstance(module, _Tables):
        module.pending_fill = False


class _Tables(nn.Module):
    """The flat (sum of cardinalities, D) weight and its initialisation, shared by both collections.

    Each table is U(-1/sqrt(cardinality), 1/sqrt(cardinality)) (zeros with ``zero_init``), each value a
    function of (``init_seed``, feature, row, column) (``table_draw``): any rows and columns can be drawn
    alone, whatever else is drawn or where. The seed itself comes from torch's global generator, so
    ``torch.manual_seed`` fixes the whole model.
    """

    cardinalities: tuple[int, ...]
    dim: int
    tier: tiered_tables.TieredTable | None = None  # the tables in a larger home, ``weight`` their row cache
    # (one-hot tables only)
    pending_fill: bool = False  # allocated ``fill_later``, not drawn yet

    def _make_weight(self, storage: TableStorage, tiered: bool = False) -> None:
        """The weight where ``storage`` says (``tiered``: this collection may keep its tables in a tier)."""
        self.init_seed = int(torch.randint(0, 2**62, (1,), device="cpu").item())
        self.zero_init = False
        device = "meta" if storage.deferred else storage.device
        where = storage.tier if tiered and device is None else None
        if where is not None:  # the tables in their home, the parameter their row cache
            self.tier = tiered_tables.TieredTable(sum(self.cardinalities), self.dim, where)
            self.weight = nn.Parameter(self.tier.cache)
        else:  # huge pages before the first write: the optimizers gather and scatter rows at random
            self.weight = nn.Parameter(hugepages.empty(sum(self.cardinalities), self.dim, device=device))
        if self.weight.device.type != "meta":
            if storage.fill_later and self.tier is None:
                self.pending_fill = True
            else:
                self.reset_tables()

    @property
    def init(self) -> TableInit:
        """How the tables are drawn (``TableInit.fill`` draws any block of rows and columns)."""
        return TableInit(self.init_seed, self.zero_init, self.cardinalities, self.dim)

    @torch.no_grad()
    def reset_tables(self, draw: int = 0) -> None:
        """Draws every table's initial values into the weight (``draw`` > 0: another set of them)."""
        init = self.init

        def fill(weight: torch.Tensor) -> None:
            for f, (off, card) in enumerate(zip(self.offsets.tolist(), self.cardinalities)):
                init.fill(weight[off : off + card], f, 0, card, draw=draw)

        if self.tier is not None:  # the home's table; the cache and the optimizer state start over
            self.tier.reset(fill)
        else:
            fill(self.weight)
        self.pending_fill = False

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.tier is not None:  # the whole table (cached rows written back), not the cache
            self.tier.flush()
            destination[prefix + "weight"] = self.tier.table

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        if prefix + "weight" in state_dict:
            self.pending_fill = False
        if self.tier is None or prefix + "weight" not in state_dict:
            return super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected,
                                                 errors)  # fmt: skip
        try:
            self.tier.load_table(state_dict[prefix + "weight"])
        except ValueError as e:
            errors.append(f"size mismatch for {prefix}weight: {e}")
        weight = self._parameters.pop("weight")  # the cache: loaded above, through the home
        try:
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)
        finally:
            self._parameters["weight"] = weight
        if prefix + "weight" in unexpected:
            unexpected.remove(prefix + "weight")


class EmbeddingCollection(_Tables):
    """Looks up one D-dimensional vector per categorical feature.

    The F tables are stacked into one (sum of cardinalities, D) parameter; feature f's id i is row
    ``offsets[f] + i``. One gather for all features beats F small lookups, and with
    ``sparse=True`` the gradient only touches the rows a batch used (docs/decisions/sparse-gradients.md). Each table
    is initialised U(-1/sqrt(cardinality), 1/sqrt(cardinality)), as the reference DLRM does (drawn block by block, see
    ``_Tables``).

    Args:
        cardinalities: rows of each feature's table (F entries).
        dim: D, the embedding width.
        sparse: produce sparse gradients (needs an optimizer that accepts them).

    Shapes: ids (B, F) int64 -> (B, F, D).
    """

    def __init__(self, cardinalities: Sequence[int], dim: int, sparse: bool = True,
                 storage: TableStorage = IN_MEMORY):  # fmt: skip
        super().__init__()
        cards = torch.tensor(
            list(cardinalities), dtype=torch.int64, device="cpu"
        )  # index data, even when built on meta
        self.cardinalities = tuple(int(c) for c in cardinalities)
        self.dim = dim
        self.sparse = sparse
        self.features = tuple(range(len(self.cardinalities)))  # the model's one-hot columns these tables serve
        self.register_buffer("offsets", torch.cumsum(cards, 0) - cards, persistent=False)  # (F,)
        self._make_weight(storage, tiered=True)
        self.use_native = True  # CPU training's lookups by ctrkit/native's gather (_GatherRowsFn; False: ATen's)

    @property
    def num_features(self) -> int:
        return len(self.cardinalities)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tier is not None:
            return self._from_tier(ids)
        if self._native_applies(ids):
            return _GatherRowsFn.apply(self.weight, ids, self.offsets)  # (B, F, D)
        return F.embedding(ids + self.offsets, self.weight, sparse=self.sparse)  # (B, F, D)

    def _from_tier(self, ids: torch.Tensor) -> torch.Tensor:
        """Training: the ids' cache slots, gathered from the cache (the parameter); else the rows read from the
        tables' home with the cached ones laid over them, leaving the cache as it is."""
        if not (torch.is_grad_enabled() and self.weight.requires_grad):
            return self.tier.lookup(ids + self.offsets)  # (B, F, D)
        slots = self.tier.slots(ids + self.offsets)  # (B, F)
        if self._native_applies(slots):
            return _GatherRowsFn.apply(self.weight, slots, torch.zeros_like(self.offsets))
        return F.embedding(slots, self.weight, sparse=self.sparse)

    def _native_applies(self, ids: torch.Tensor) -> bool:
        """The lookup by ctrkit/native's gather (``_GatherRowsFn``): CPU training of a float32 table with sparse
        gradients, where the kernels are built; elsewhere (scoring, export, compile, dense gradients) ATen's."""
        w = self.weight
        if not (self.use_native and self.sparse and torch.is_grad_enabled() and w.requires_grad):
            return False
        if w.device.type != "cpu" or w.dtype != torch.float32 or not w.is_contiguous() or w.dim() != 2:
            return False
        if ids.dtype != torch.int64 or ids.dim() != 2 or ids.device.type != "cpu" or torch.compiler.is_compiling():
            return False
        return native.library() is not None

    def table_parameters(self) -> list[nn.Parameter]:
        """The embedding tables, for optimizers that update them by rows."""
        return [self.weight]

    def table(self, feature: int) -> torch.Tensor:
        """The rows of one feature's table: (cardinality, D), a view of the flat weight (of the home's table when
        the tables are tiered, their cached rows written back first)."""
        off = int(self.offsets[feature])
        if self.tier is not None:
            self.tier.flush()
            return self.tier.table[off : off + self.cardinalities[feature]]
        return self.weight[off : off + self.cardinalities[feature]]


class _GatherRowsFn(torch.autograd.Function):
    """``F.embedding(ids + offsets, weight, sparse=True)`` on the CPU by ctrkit/native/rows.c's gather, which
    prefetches the scattered rows; the same output, and the same sparse gradient as ATen's embedding backward
    (indices the flat ids, values the output's gradient as (B x F, D) rows, uncoalesced)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        ids = ids.contiguous()
        (b, f), (rows, d) = ids.shape, weight.shape
        out = torch.empty(b, f, d, dtype=weight.dtype)
        flat = torch.empty(b * f, dtype=torch.int64)
        outside = native.library().ctrkit_gather_rows_f32(
            weight.data_ptr(), rows, ids.data_ptr(), offsets.contiguous().data_ptr(), b * f, f, d, out.data_ptr(),
            flat.data_ptr(),
        )  # fmt: skip
        if outside:
            raise IndexError(f"{outside} ids outside their tables (an embedding of {rows} rows)")
        ctx.save_for_backward(flat)
        ctx.weight_shape = weight.shape
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (flat,) = ctx.saved_tensors
        values = grad.reshape(-1, ctx.weight_shape[1])
        return torch.sparse_coo_tensor(flat.view(1, -1), values, ctx.weight_shape, check_invariants=False), None, None


class EmbeddingBagCollection(_Tables):
    """Pools a variable number of ids per sample for each multi-hot feature.

    Like EmbeddingCollection, one flat (sum of cardinalities, D) table with per-feature row
    offsets and sparse gradients. Each (feature, sample) bag is pooled by its feature's combiner:
    ``sum`` or ``mean`` (an empty bag gives zeros either way). One ``embedding_bag`` call in sum
    mode serves all features; mean features are then divided by their bag lengths.

    Args:
        cardinalities: rows of each multi-hot feature's table (Fm entries).
        dim: D.
        combiners: "sum" or "mean" per feature.
        sparse: produce sparse gradients.

    Shapes: MultiHot or PaddedMultiHot with B samples -> (B, Fm, D).
    """

    def __init__(self, cardinalities: Sequence[int], dim: int, combiners: Sequence[str], sparse: bool = True,
                 storage: TableStorage = IN_MEMORY):  # fmt: skip
        super().__init__()
        if len(combiners) != len(cardinalities) or any(c not in ("sum", "mean") for c in combiners):
            raise ValueError(f"need one combiner ('sum' or 'mean') per multi-hot feature, got {list(combiners)}")
        cards = torch.tensor(
            list(cardinalities), dtype=torch.int64, device="cpu"
        )  # index data, even when built on meta
        self.cardinalities = tuple(int(c) for c in cardinalities)
        self.combiners = tuple(combiners)
        self.dim = dim
        self.sparse = sparse
        self.register_buffer("offsets", torch.cumsum(cards, 0) - cards, persistent=False)  # (Fm,)
        self.register_buffer(
            "is_mean", torch.tensor([c == "mean" for c in combiners], dtype=torch.bool, device="cpu"), persistent=False
        )
        self._make_weight(storage)

    def table_parameters(self) -> list[nn.Parameter]:
        """The embedding tables, for optimizers that update them by rows."""
        return [self.weight]

    def table(self, feature: int) -> torch.Tensor:
        """The rows of one feature's table: (cardinality, D), a view of the flat weight."""
        off = int(self.offsets[feature])
        return self.weight[off : off + self.cardinalities[feature]]

    def forward(self, multi_hot) -> torch.Tensor:
        if isinstance(multi_hot, PaddedMultiHot):
            return self._pool_padded(multi_hot.ids)
        fm = len(self.cardinalities)
        b = (multi_hot.offsets.numel() - 1) // fm
        per_feature = multi_hot.offsets[::b]  # (Fm + 1,) first bag of each feature, and the end
        counts = per_feature[1:] - per_feature[:-1]  # (Fm,) ids per feature
        # (nnz,); the output's size given: a GPU need not read it back from the counts
        rows = multi_hot.ids + torch.repeat_interleave(self.offsets, counts, output_size=multi_hot.ids.numel())
        pooled = F.embedding_bag(
            rows, self.weight, multi_hot.offsets, mode="sum", sparse=self.sparse, include_last_offset=True
        ).view(fm, b, self.dim)  # (Fm, B, D)
        if "mean" in self.combiners:  # known on the host: no read of a device tensor a step
            lengths = (multi_hot.offsets[1:] - multi_hot.offsets[:-1]).view(fm, b, 1).clamp_min(1)
            scale = torch.where(self.is_mean.view(fm, 1, 1), 1.0 / lengths.to(pooled.dtype), 1.0)
            pooled = pooled * scale
        return pooled.transpose(0, 1)  # (B, Fm, D)

    def _pool_padded(self, ids: torch.Tensor) -> torch.Tensor:
        return pool_padded(ids, self.offsets, self.is_mean, lambda rows: F.embedding(rows, self.weight))


def pool_padded(ids: torch.Tensor, offsets: torch.Tensor, is_mean: torch.Tensor, lookup) -> torch.Tensor:
    """Pools padded bags as EmbeddingBagCollection pools the same bags given as a MultiHot.

    Args:
        ids: (B, Fm, L) ids, negative entries padding.
        offsets: (Fm,) first row of each feature in the flat table.
        is_mean: (Fm,) bool, the features pooled by mean (the others by sum).
        lookup: flat table rows (any shape) -> their vectors (shape + (D,)).

    Returns:
        (B, Fm, D); an empty bag gives zeros.
    """
    valid = ids >= 0  # (B, Fm, L)
    vectors = lookup(ids.clamp_min(0) + offsets.view(1, -1, 1))  # (B, Fm, L, D)
    pooled = (vectors * valid.unsqueeze(-1).to(vectors.dtype)).sum(2)  # (B, Fm, D)
    lengths = valid.sum(2, keepdim=True).clamp_min(1).to(pooled.dtype)  # (B, Fm, 1); no branch: exports trace it
    return torch.where(is_mean.view(1, -1, 1), pooled / lengths, pooled)


class CategoricalEmbeddings(nn.Module):
    """Every categorical feature's embedding: one-hot features gathered, multi-hot ones pooled.

    The sparse part every model shares: an EmbeddingCollection for the one-hot features and, when
    there are multi-hot features, an EmbeddingBagCollection after them.

    Args:
        cardinalities: rows of each one-hot feature's table (F1 entries).
        dim: D.
        sparse: produce sparse gradients.
        multi_hot_cardinalities: rows of each multi-hot feature's table (Fm entries).
        multi_hot_combiners: "sum" or "mean" per multi-hot feature.

    Shapes: categorical (B, F1) int64, multi_hot (Fm features) or None -> (B, F1 + Fm, D).

    Attributes:
        num_features: F1 + Fm.
        output_width: (F1 + Fm) * D, the width of the output flattened per sample (``MixedWidthEmbeddings``
            has the same two attributes, so models that concatenate take either).
    """

    def __init__(
        self,
        cardinalities: Sequence[int],
        dim: int,
        sparse: bool = True,
        multi_hot_cardinalities: Sequence[int] = (),
        multi_hot_combiners: Sequence[str] = (),
        storage: TableStorage = IN_MEMORY,
    ):
        super().__init__()
        # no one-hot features: only in MixedWidthEmbeddings's groups (a model has at least one)
        self.onehot = EmbeddingCollection(cardinalities, dim, sparse, storage) if len(cardinalities) else None
        self.bags = (
            EmbeddingBagCollection(multi_hot_cardinalities, dim, multi_hot_combiners, sparse, storage)
            if (multi_hot_cardinalities)
            else None
        )
        self.num_features = len(cardinalities) + len(multi_hot_cardinalities)
        self.output_width = dim * self.num_features  # of the output flattened to (B, F * D)

    @classmethod
    def from_config(cls, config, dim: int, storage: TableStorage = IN_MEMORY) -> CategoricalEmbeddings:
        """The tables a model config describes (``cardinalities``, ``sparse_gradients``, ``multi_hot_*``), kept
        where ``storage`` says."""
        return cls(
            config.cardinalities,
            dim,
            config.sparse_gradients,
            config.multi_hot_cardinalities,
            config.multi_hot_combiners,
            storage,
        )

    def forward(self, categorical: torch.Tensor, multi_hot=None) -> torch.Tensor:
        emb = self.onehot(categorical) if self.onehot is not None else None  # (B, F1, D)
        if self.bags is None:
            return emb
        if multi_hot is None:
            raise ValueError(f"the model has {len(self.bags.cardinalities)} multi-hot features but the batch has none")
        pooled = self.bags(multi_hot)  # (B, Fm, D)
        return pooled if emb is None else torch.cat([emb, pooled], dim=1)  # (B, F1 + Fm, D)
