"""What training, export and serving ask of a model: its tables, its first-order part, its output layer and its
inputs. Every registered model implements ``CTRModel``; the rest of ctrkit reaches a model's parts through this
module, never by probing for attribute names of its own."""

from __future__ import annotations

from torch import nn


def table_modules(model: nn.Module) -> list[nn.Module]:
    """The embedding collections of ``model`` (one-hot and multi-hot, deep and first-order, plain, on disk or
    sharded): the modules that name their tables with ``table_parameters()``."""
    return [m for m in model.modules() if hasattr(m, "table_parameters")]


def table_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every embedding table of ``model``, as parameters."""
    return [p for m in table_modules(model) for p in m.table_parameters()]


def table_parameter_ids(model: nn.Module) -> set[int]:
    """The ``id`` of each of ``model``'s tables (to tell tables from dense parameters)."""
    return {id(p) for p in table_parameters(model)}


def redraw_tables(model: nn.Module, draw: int) -> list[nn.Parameter] | None:
    """Redraws ``model``'s deep tables (``embeddings``; draw ``draw``: the same values at any world size) and returns
    them; the first-order tables are kept. None: the model has no deep tables."""
    tables = getattr(model, "embeddings", None)
    if tables is None:
        return None
    params = []
    for collection in table_modules(tables):
        if hasattr(collection, "reset_tables"):
            collection.reset_tables(draw=draw)
            params += collection.table_parameters()
    return params
