"""What training, export and serving ask of a model: its tables, its first-order part, its output layer and its
inputs. Every registered model implements ``CTRModel``; the rest of ctrkit reaches a model's parts through this
module, never by probing for attribute names of its own."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

# the parts every model has (None where it has none), as CTRModel declares them
PARTS = ("config", "dynamic_ids", "numerical_norm", "embeddings", "wide_embeddings", "wide_dense", "wide_buckets")


@runtime_checkable
class CTRModel(Protocol):
    """What every registered model is (besides an ``nn.Module``), with B the batch, F the one-hot features, N the
    numerical ones.

    Attributes:
        config: the model's config dataclass (``registry.config_class``), from which ``create_model`` builds it
            again.
        dynamic_ids: raw 64-bit ids -> rows of the dynamic features' tables (``models.dynamic.DynamicIds``), or
            None.
        numerical_norm: the numerical inputs' normaliser, fitted before the first step
            (``models.numerical.NumericalNormalizer``).
        embeddings: the deep embedding tables (one collection, one-hot and multi-hot), redrawn by
            ``reinit_embeddings``; None for a model without deep tables.
        wide_embeddings, wide_dense, wide_buckets: the first-order term's per-id weights, its linear map of the
            numerical inputs and their buckets' weights (None: none); trained by their own optimizer and fitted by
            the linear warm start.
        output_layer: the ``nn.Linear`` producing the deep part's logit (zeroed by the warm start, so the model
            starts as its first-order term).

    Methods:
        forward(numerical (B, N) float or None, categorical (B, F) int64, multi_hot or None) -> logits (B,).
        wide_parameters(): the first-order term's parameters ([] without one).
    """

    config: Any
    dynamic_ids: nn.Module | None
    numerical_norm: nn.Module
    embeddings: nn.Module | None
    wide_embeddings: nn.Module | None
    wide_dense: nn.Linear | None
    wide_buckets: nn.Module | None

    @property
    def output_layer(self) -> nn.Linear: ...

    def forward(
        self, numerical: torch.Tensor | None, categorical: torch.Tensor, multi_hot: Any = None
    ) -> torch.Tensor: ...

    def wide_parameters(self) -> list[nn.Parameter]: ...


@runtime_checkable
class TableCollection(Protocol):
    """An embedding collection (one-hot or multi-hot, deep or first-order, plain, tiered or sharded): what training
    asks of a model's tables.

    Attributes:
        tier: the ``models.tiered_tables.TieredTable`` keeping its tables in host memory or on disk (its ``weight``
            their row cache), or None.

    Methods:
        table_parameters(): its tables, as the parameters that the row optimizers update.
    """

    tier: Any

    def table_parameters(self) -> list[nn.Parameter]: ...


@runtime_checkable
class RedrawnTables(TableCollection, Protocol):
    """A collection that ``reinit_embeddings`` can redraw (a single process's, in memory or tiered).

    Methods:
        reset_tables(draw): draws its tables again (draw ``draw``: the same values at any world size).
    """

    def reset_tables(self, draw: int) -> None: ...


def contract_problems(model: nn.Module) -> list[str]:
    """What ``model`` lacks of ``CTRModel``, in words ([] where it is one)."""
    problems = [f"no attribute '{name}' (None where the model has none)" for name in PARTS if not hasattr(model, name)]
    if not isinstance(getattr(model, "output_layer", None), nn.Linear):
        problems.append("'output_layer' is not an nn.Linear")
    if not callable(getattr(model, "wide_parameters", None)):
        problems.append("no method 'wide_parameters'")
    elif model.wide_embeddings is None and model.wide_parameters():
        problems.append("'wide_parameters' returns parameters of a model without a first-order term")
    return problems


def tables_by_id(model: nn.Module) -> dict[int, TableCollection]:
    """Each of ``model``'s tables' ``id``, mapped to the collection holding it."""
    return {id(p): m for m in table_modules(model) for p in m.table_parameters()}


def table_modules(model: nn.Module) -> list[TableCollection]:
    """The embedding collections of ``model`` (one-hot and multi-hot, deep and first-order, plain, on disk or
    sharded): its ``TableCollection`` modules."""
    return [m for m in model.modules() if isinstance(m, TableCollection)]


def table_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every embedding table of ``model``, as parameters."""
    return [p for m in table_modules(model) for p in m.table_parameters()]


def table_parameter_ids(model: nn.Module) -> set[int]:
    """The ``id`` of each of ``model``'s tables (to tell tables from dense parameters)."""
    return {id(p) for p in table_parameters(model)}


def redraw_tables(model: nn.Module, draw: int) -> list[nn.Parameter] | None:
    """Redraws ``model``'s deep tables (``embeddings``; draw ``draw``: the same values at any world size) and returns
    them; the first-order tables are kept. None: the model has no deep tables."""
    tables = model.embeddings
    if not isinstance(tables, nn.Module):  # None: no deep tables
        return None
    params = []
    for collection in table_modules(tables):
        if isinstance(collection, RedrawnTables):
            collection.reset_tables(draw=draw)
            params += collection.table_parameters()
    return params
