"""The input fields every model config shares (the dataset's shape), their checks, and the input layers.

Each check raises a ValueError naming the field and what was expected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ctrkit.models.embeddings import CategoricalEmbeddings, tables_written
from ctrkit.models.mlp import MLP
from ctrkit.models.numerical import (
    MAX_BUCKETS,
    NUMERICAL_BUCKETS,
    NumericalBuckets,
    NumericalNormalizer,
)
from ctrkit.models.storage import IN_MEMORY, TableStorage


def check_inputs(num_numerical: int, cardinalities: Sequence[int], embedding_dim: int) -> None:
    """The dataset-derived fields every model config has."""
    if num_numerical < 0:
        raise ValueError(f"num_numerical must be >= 0, got {num_numerical}")
    if not cardinalities:
        raise ValueError(
            "the data has no categorical features (cardinalities is empty): every model embeds at least one; "
            "add an id column, or a numerical one bucketed into ids"
        )
    if any(int(c) < 1 for c in cardinalities):
        raise ValueError(f"cardinalities must be a non-empty list of positive integers, got {list(cardinalities)}")
    if embedding_dim < 1:
        raise ValueError(f"embedding_dim must be positive, got {embedding_dim}")


def check_multi_hot(cardinalities: Sequence[int], combiners: Sequence[str]) -> None:
    """One positive cardinality and one combiner (sum/mean) per multi-hot feature."""
    if any(int(c) < 1 for c in cardinalities):
        raise ValueError(f"multi_hot_cardinalities must be positive integers, got {list(cardinalities)}")
    if len(combiners) != len(cardinalities) or any(c not in ("sum", "mean") for c in combiners):
        raise ValueError(
            f"multi_hot_combiners needs one of 'sum'/'mean' per multi-hot feature ({len(cardinalities)}), "
            f"got {list(combiners)}"
        )


# The training defaults every model starts from, chosen on the accuracy panel (docs/decisions/optimizers.md): Adam
# on the dense part and the embeddings at batch 1024, and Adagrad for the first-order (wide) part as the
# Wide & Deep seed trains it. The seeds' rates (1e-4, 1.2e-4) are for Criteo 1TB's billions of steps.
# Early stopping and plateau patience are not per model: the plan sets them (``train/plan.py``:
# 8 / 4 evaluations, or 20 / 10 on small data).
TRAIN_DEFAULTS = {
    "optimizer": "adam",
    "lr": 1e-3,
    "embedding_optimizer": "adam",
    "embedding_lr": 1e-2,
    "batch_size": 1024,
    "wide_optimizer": "adagrad",
    "wide_lr": 0.02,
}


@dataclass(frozen=True)
class InputsConfig:
    """What every model reads: the dataset's features and the embedding width.

    Attributes:
        num_numerical: numerical input features (13 for Criteo).
        cardinalities: rows of each one-hot categorical feature's table.
        embedding_dim: D.
        sparse_gradients: embeddings produce sparse gradients (keep True for speed).
        multi_hot_cardinalities: rows of each multi-hot feature's table (several ids per sample).
        multi_hot_combiners: "sum" or "mean" pooling per multi-hot feature.
        embedding_dims: a width per categorical feature (the one-hot features, then the multi-hot ones),
            for models that concatenate the embeddings (Wide & Deep, DCNv2); empty: ``embedding_dim``
            for every feature.
        numerical_buckets: quantile buckets per numerical feature whose weights the first-order term adds
            (``NumericalBuckets``; at most this many, fewer where training holds few clicks); 0 for none.
        dynamic_features: the one-hot features (indices into ``cardinalities``) given as raw 64-bit ids, each
            mapped to the rows of its table of ``cardinalities[i]`` rows by the model's ``dynamic_ids``
            (``models/dynamic.py``).
    """

    num_numerical: int
    cardinalities: tuple[int, ...]
    embedding_dim: int = 16
    sparse_gradients: bool = True
    multi_hot_cardinalities: tuple[int, ...] = ()
    multi_hot_combiners: tuple[str, ...] = ()
    embedding_dims: tuple[int, ...] = ()
    numerical_buckets: int = NUMERICAL_BUCKETS
    dynamic_features: tuple[int, ...] = ()

    def validate(self) -> None:
        check_inputs(self.num_numerical, self.cardinalities, self.embedding_dim)
        if any(not 0 <= f < len(self.cardinalities) for f in self.dynamic_features) or any(
            self.cardinalities[f] < 2 for f in self.dynamic_features
        ):
            raise ValueError(
                f"dynamic_features must index one-hot features whose tables have at least 2 rows, got "
                f"{list(self.dynamic_features)}"
            )
        if not 0 <= self.numerical_buckets <= MAX_BUCKETS or self.numerical_buckets == 1:
            raise ValueError(f"numerical_buckets must be 0 (none) or 2 to {MAX_BUCKETS}, got {self.numerical_buckets}")
        check_multi_hot(self.multi_hot_cardinalities, self.multi_hot_combiners)
        features = len(self.cardinalities) + len(self.multi_hot_cardinalities)
        if self.embedding_dims and (len(self.embedding_dims) != features or min(self.embedding_dims) < 1):
            raise ValueError(
                f"embedding_dims needs one positive width per categorical feature ({features}), "
                f"got {list(self.embedding_dims)}"
            )

    @property
    def feature_dims(self) -> tuple[int, ...]:
        """The embedding width of each categorical feature (one-hot, then multi-hot)."""
        features = len(self.cardinalities) + len(self.multi_hot_cardinalities)
        return tuple(self.embedding_dims) or (self.embedding_dim,) * features

    @property
    def mixed_widths(self) -> bool:
        """Whether the features' embedding widths differ from ``embedding_dim`` (per-feature tables)."""
        return any(d != self.embedding_dim for d in self.feature_dims)


@dataclass(frozen=True)
class BottomTopConfig(InputsConfig):
    """Inputs plus a bottom MLP over the numerical features and a top MLP ending in the logit.

    Attributes:
        bottom_mlp: layer widths of the bottom MLP; the last must be ``embedding_dim`` when there are
            numerical features (its output sits beside the embeddings).
        top_mlp: layer widths of the top MLP; the last must be 1 (the logit).
        linear: add a first-order (linear) term to the logit, as DeepFM does: one weight per id and a
            linear map of the numerical features, trained as a model's wide part.
    """

    bottom_mlp: tuple[int, ...] = (512, 256, 64, 16)
    top_mlp: tuple[int, ...] = (512, 256, 1)
    linear: bool = True

    def validate(self) -> None:
        super().validate()
        if self.num_numerical and (not self.bottom_mlp or self.bottom_mlp[-1] != self.embedding_dim):
            raise ValueError(
                f"bottom_mlp must end in embedding_dim={self.embedding_dim} so its output can interact with the "
                f"embeddings, got {list(self.bottom_mlp)}"
            )
        if not self.top_mlp or self.top_mlp[-1] != 1:
            raise ValueError(f"top_mlp must end in 1 (the logit), got {list(self.top_mlp)}")


def input_layers(config: BottomTopConfig, storage: TableStorage = IN_MEMORY) -> tuple[MLP | None, nn.Module, int]:
    """The bottom MLP (None without numerical features), the embeddings (kept where ``storage`` says), and how many
    D-wide vectors
    they give each sample (categorical features, plus one for the bottom MLP's output; with per-feature
    widths, ``embedding_dims``, the embeddings are ``MixedWidthEmbeddings`` and the count is of
    features)."""
    bottom = MLP(config.num_numerical, config.bottom_mlp) if config.num_numerical else None
    embeddings = deep_embeddings(config, storage)
    return bottom, embeddings, embeddings.num_features + (bottom is not None)


def deep_embeddings(config: InputsConfig, storage: TableStorage = IN_MEMORY) -> nn.Module:
    """The model's embeddings, kept where ``storage`` says: one width for all features (``CategoricalEmbeddings``)
    or, when ``embedding_dims`` gives features other widths, ``MixedWidthEmbeddings``."""
    if config.mixed_widths:
        return MixedWidthEmbeddings(config, storage)
    return CategoricalEmbeddings.from_config(config, config.embedding_dim, storage)


class MixedWidthEmbeddings(nn.Module):
    """Embeddings whose widths differ by feature (the Wide & Deep seed's ``--embedding_sizes_file``),
    for models that concatenate them.

    Features of one width share a ``CategoricalEmbeddings`` (flat tables, sparse gradients, the same
    initialisation), one per distinct width in ``groups``; the output puts every feature's vector back in
    feature order. Shapes: categorical (B, F1) int64, multi_hot (Fm features) or None -> (B, sum of the
    widths).
    """

    def __init__(self, config: InputsConfig, storage: TableStorage = IN_MEMORY):
        super().__init__()
        dims = config.feature_dims
        n1 = len(config.cardinalities)
        self.num_features = len(dims)
        self.output_width = sum(dims)
        self.widths = tuple(sorted(set(dims)))
        self.groups = nn.ModuleDict()
        self._members: list[tuple[list[int], list[int]]] = []  # per group: its one-hot and multi-hot features
        for g, width in enumerate(self.widths):
            onehot = [f for f in range(n1) if dims[f] == width]
            multi = [f for f in range(len(config.multi_hot_cardinalities)) if dims[n1 + f] == width]
            self._members.append((onehot, multi))
            self.register_buffer(  # the group's columns of the categorical input, gathered once per batch
                f"_onehot{g}", torch.tensor(onehot, dtype=torch.int64, device="cpu"), persistent=False
            )
            self.groups[f"d{width}"] = CategoricalEmbeddings(
                [config.cardinalities[f] for f in onehot], width, config.sparse_gradients,
                [config.multi_hot_cardinalities[f] for f in multi], [config.multi_hot_combiners[f] for f in multi],
                storage,
            )  # fmt: skip
            if self.groups[f"d{width}"].onehot is not None:
                self.groups[f"d{width}"].onehot.features = tuple(onehot)
        order = [f for onehot, multi in self._members for f in (*onehot, *(n1 + m for m in multi))]
        # the output's columns: group outputs concatenated, then each feature's columns put back in order
        starts, at = {}, 0
        for f in order:
            starts[f] = at
            at += dims[f]
        columns = [c for f in range(len(dims)) for c in range(starts[f], starts[f] + dims[f])]
        self.register_buffer(
            "columns", torch.tensor(columns, dtype=torch.int64, device="cpu"), persistent=False
        )  # index data, even when built on meta

    def forward(self, categorical: torch.Tensor, multi_hot=None) -> torch.Tensor:
        parts = []
        for g, ((_, multi), group) in enumerate(zip(self._members, self.groups.values())):
            ids = categorical.index_select(1, getattr(self, f"_onehot{g}"))  # (B, F1 of this width)
            parts.append(group(ids, select_multi_hot(multi_hot, multi) if multi else None).flatten(1))
        return torch.cat(parts, 1).index_select(1, self.columns)  # (B, sum of widths)


def select_multi_hot(multi_hot, features: list[int]):
    """The bags of ``features`` only, as the same kind of batch (MultiHot or PaddedMultiHot)."""
    from ctrkit.data.batch import MultiHot, PaddedMultiHot

    if multi_hot is None:
        raise ValueError("the model has multi-hot features but the batch has none")
    if isinstance(multi_hot, PaddedMultiHot):
        return PaddedMultiHot(multi_hot.ids[:, features])
    fm = multi_hot.num_features
    b = (multi_hot.offsets.numel() - 1) // fm
    ids, offsets, start = [], [multi_hot.offsets.new_zeros(1)], 0
    for f in features:
        lo, hi = multi_hot.offsets[f * b], multi_hot.offsets[(f + 1) * b]
        ids.append(multi_hot.ids[lo:hi])
        offsets.append(multi_hot.offsets[f * b + 1 : (f + 1) * b + 1] - lo + start)
        start = start + (hi - lo)
    return MultiHot(torch.cat(ids), torch.cat(offsets), len(features))


class LinearTerm(nn.Module):
    """The first-order part of a model: one weight per id of every categorical feature (1-wide tables)
    summed over the features, plus a linear map of the numerical features and their bucket weights
    (``NumericalBuckets``); zero at the start.

    Models keep its parts as their own ``wide_embeddings``, ``wide_dense`` and ``wide_buckets``
    attributes (the names their checkpoints use); ``logit`` computes the term from them.
    """

    @staticmethod
    def build(
        config: InputsConfig, storage: TableStorage = IN_MEMORY
    ) -> tuple[CategoricalEmbeddings, nn.Linear | None, NumericalBuckets | None]:
        """The term's parts: the 1-wide tables (as ``storage`` says, but in memory: one number a row), the linear
        map (None without numerical features) and the bucket weights (None without numerical features or with
        ``numerical_buckets`` 0)."""
        tables = CategoricalEmbeddings.from_config(config, 1, storage.in_memory())
        dense = nn.Linear(config.num_numerical, 1) if config.num_numerical else None
        with torch.no_grad():  # a linear model starts at zero
            for p in [*tables.parameters(), *(dense.parameters() if dense is not None else ())]:
                p.zero_()
            for m in tables.modules():  # also when its tables are drawn later, shard by shard
                if hasattr(m, "zero_init"):
                    m.zero_init = True
                tables_written(m)  # zeroed whole: not drawn again after the warm start wrote them
        buckets = None
        if config.num_numerical and config.numerical_buckets:
            buckets = NumericalBuckets(config.num_numerical, config.numerical_buckets)
        return tables, dense, buckets

    @staticmethod
    def logit(
        tables: CategoricalEmbeddings, dense: nn.Linear | None, numerical: torch.Tensor | None,
        categorical: torch.Tensor, multi_hot=None, buckets: NumericalBuckets | None = None,
        raw: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """(B,) the term for a batch: ``numerical`` normalised, ``raw`` the inputs as given (the buckets')."""
        out = tables(categorical, multi_hot).sum((1, 2))  # (B,)
        if dense is not None:
            out = out + dense(numerical).squeeze(1).to(out.dtype)
        if buckets is not None:
            out = out + buckets(raw).to(out.dtype)
        return out


class WideParameters:
    """Mixin of models with a first-order part in ``wide_embeddings``/``wide_dense``/``wide_buckets``
    (None: none): ``wide_parameters`` hands them to their own optimizer (see
    ``train/optim.build_optimizers``); and the start every model's forward pass shares (``model_inputs``)."""

    wide_embeddings: CategoricalEmbeddings | None
    wide_dense: nn.Linear | None
    wide_buckets: NumericalBuckets | None  # set by each model (a class default would hide the module)
    dynamic_ids: nn.Module | None  # raw ids -> rows of the dynamic features (``dynamic_ids``; None: none)
    numerical_norm: NumericalNormalizer

    def model_inputs(self, numerical, categorical) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(categorical, numerical, raw): the categorical ids with the dynamic features' raw ids as their rows, the
        numerical features standardised (``NumericalNormalizer``, (B, N)), and as given (the buckets read them)."""
        if self.dynamic_ids is not None:
            categorical = self.dynamic_ids(categorical)
        return categorical, self.numerical_norm(numerical), numerical

    def wide_parameters(self) -> list[nn.Parameter]:
        if self.wide_embeddings is None:
            return []
        dense = list(self.wide_dense.parameters()) if self.wide_dense is not None else []
        buckets = list(self.wide_buckets.parameters()) if self.wide_buckets is not None else []
        return list(self.wide_embeddings.parameters()) + dense + buckets

    def wide_logit(self, numerical, categorical, multi_hot=None, raw=None) -> torch.Tensor | None:
        """(B,) the first-order term, or None for a model without one (``numerical`` normalised, ``raw`` as
        given)."""
        if self.wide_embeddings is None:
            return None
        return LinearTerm.logit(
            self.wide_embeddings, self.wide_dense, numerical, categorical, multi_hot, self.wide_buckets, raw
        )

    def plus_wide(self, logits: torch.Tensor, numerical, categorical, multi_hot=None, raw=None) -> torch.Tensor:
        """``logits`` (B,) plus the first-order term where the model has one."""
        wide = self.wide_logit(numerical, categorical, multi_hot, raw)
        return logits if wide is None else logits + wide.to(logits.dtype)
