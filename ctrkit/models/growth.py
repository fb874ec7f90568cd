"""Growing a trained model's tables for data whose vocabularies extend its own (``preprocess table --like``): a
feature's learned rows keep their place within the feature's table, and the rows for values the model has not
seen, after them, keep the new model's own initial values (drawn as any table's; zeros for first-order tables).

Tables are found as what they are (``embeddings._Tables``: a flat weight of one block of rows per feature), never by
parameter names; the model before growth is described by the same modules built on the meta device."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ctrkit.models.embeddings import _Tables


def table_rows(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Each table weight's name (as ``state_dict`` names it) -> the rows of each feature's block, in order."""
    return {f"{name}.weight" if name else "weight": tuple(int(c) for c in module.cardinalities)
            for name, module in model.named_modules() if isinstance(module, _Tables)}  # fmt: skip


def grown(old: torch.Tensor, fill: torch.Tensor, old_rows: Sequence[int], new_rows: Sequence[int]) -> torch.Tensor:
    """``fill`` (the grown table's rows, or state) with each feature's block of ``old`` copied to the start of the
    feature's block: ``old_rows`` and ``new_rows`` give the blocks before and after growth."""
    if len(old_rows) != len(new_rows) or any(b < a for a, b in zip(old_rows, new_rows)):
        raise ValueError(f"tables of rows {list(old_rows)} cannot grow to {list(new_rows)}")
    if old.shape[0] != sum(old_rows) or fill.shape[0] != sum(new_rows) or old.shape[1:] != fill.shape[1:]:
        raise ValueError(f"a table of shape {tuple(old.shape)} is not the blocks {list(old_rows)}")
    out = fill.detach().clone()
    at_old = at_new = 0
    for a, b in zip(old_rows, new_rows):
        out[at_new : at_new + a] = old[at_old : at_old + a]
        at_old, at_new = at_old + a, at_new + b
    return out


def grown_weights(
    weights: Mapping[str, torch.Tensor], before: Mapping[str, tuple[int, ...]], model: nn.Module
) -> tuple[dict[str, torch.Tensor], dict[str, tuple[tuple[int, ...], tuple[int, ...]]]]:
    """``weights`` (a state dict of the model whose tables had ``before``'s rows) for ``model``, whose tables may
    have more rows a feature; and each grown table's (rows before, rows after)."""
    after = table_rows(model)
    state = model.state_dict()
    out, changed = dict(weights), {}
    for name, rows in after.items():
        if before.get(name, rows) != rows:
            out[name] = grown(weights[name], state[name], before[name], rows)
            changed[name] = (before[name], rows)
    return out, changed
