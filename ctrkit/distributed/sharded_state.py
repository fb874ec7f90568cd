"""Resuming optimizer states when a hybrid-parallel run is involved, whatever the world size or sharding
the checkpoint was written with: the table optimizers' per-row states are cut from the saved shards (or
whole tables) into this rank's shards, the other optimizers' states are the same on every rank."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ctrkit.checkpoint_shards import key_regions, table_prefix
from ctrkit.distributed.hybrid import HybridModel, table_collections

# (table prefix, flat row_lo, flat row_hi, col_lo, col_hi): where a table parameter (a whole flat table of a
# collection, or one shard of it) lies in the collection's flat (sum of cardinalities, dim) table
Region = tuple[str, int, int, int, int]


def _collections(model: torch.nn.Module) -> Iterator[tuple[str, str, bool, torch.nn.Module]]:
    """Each table collection of ``model`` (whole or sharded) in parameter order: (plan name, state-dict
    prefix, whether it is the first-order part's, the module)."""
    for name, coll in table_collections(getattr(model, "model", model)).items():
        yield name, table_prefix(name), name.split(".")[0] == "wide_embeddings", coll


def _target_regions(model: torch.nn.Module) -> dict[int, Region]:
    """id(parameter) -> its region, for every table parameter of ``model``."""
    out: dict[int, Region] = {}
    for _, prefix, _, coll in _collections(model):
        if hasattr(coll, "shards"):
            offsets = [sum(coll.cardinalities[:f]) for f in range(len(coll.cardinalities))]
            for s, w in zip(coll.local, coll.shards):
                out[id(w)] = (prefix, offsets[s.feature] + s.row_lo, offsets[s.feature] + s.row_hi, s.col_lo, s.col_hi)
        else:
            out[id(coll.weight)] = (prefix, 0, sum(coll.cardinalities), 0, coll.dim)
    return out


def _source_regions(model: torch.nn.Module, wide: bool, sharding: dict | None, rank: int | None) -> list[Region]:
    """The regions of a saved table optimizer's parameters, in its order: the tables of the collections
    of its part (first-order or not), whole (``sharding`` None: a single-process run) or as rank ``rank``
    of the run that wrote ``sharding`` held them."""
    out: list[Region] = []
    for name, prefix, is_wide, coll in _collections(model):
        if is_wide != wide:
            continue
        if sharding is None:
            out.append((prefix, 0, sum(coll.cardinalities), 0, coll.dim))
            continue
        out += [(prefix, *region) for r, *region in key_regions(sharding[name])[2] if r == rank]
    return out


def _cut(target: Region, pieces: list[tuple[Region, dict[str, Any]]]) -> dict[str, Any] | None:
    """A table parameter's optimizer state for region ``target`` from the saved states of ``pieces``
    (regions of the same table): element states (Adam's moments, Adagrad's and FTRL's accumulators)
    copied where the regions overlap; a row-wise state (one value per row: the mean of the squared
    gradient over the row's columns) as the average over the overlapping pieces weighted by the columns
    they share, exact when the saved pieces split the target's columns. None where no piece has state."""
    prefix, lo, hi, col_lo, col_hi = target
    seen, found = set(), []
    for region, state in pieces:  # a replicated table is saved by every rank: count it once
        if region[0] == prefix and region[1] < hi and region[2] > lo and region[3] < col_hi and region[4] > col_lo:
            if state and region not in seen:
                seen.add(region)
                found.append((region, state))
    if not found:
        return None
    out: dict[str, Any] = {}
    width = col_hi - col_lo
    for name, value in found[0][1].items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            out[name] = max(s[name] for _, s in found)  # the step count (the same for every piece)
            continue
        cut = torch.zeros((hi - lo,) + ((width,) if value.dim() == 2 else ()), dtype=value.dtype)
        for (_, p_lo, p_hi, p_col_lo, p_col_hi), state in found:
            r_lo, r_hi, c_lo, c_hi = max(lo, p_lo), min(hi, p_hi), max(col_lo, p_col_lo), min(col_hi, p_col_hi)
            piece = state[name][r_lo - p_lo : r_hi - p_lo]
            if value.dim() == 2:
                cut[r_lo - lo : r_hi - lo, c_lo - col_lo : c_hi - col_lo] = piece[:, c_lo - p_col_lo : c_hi - p_col_lo]
            else:
                cut[r_lo - lo : r_hi - lo] += piece * ((c_hi - c_lo) / width)
        out[name] = cut
    return out


def optimizer_states_for_rank(
    optimizers: list[torch.optim.Optimizer],
    saved: list[dict],
    rank_optimizers: list | None,
    sharding: dict | None,
    model: torch.nn.Module,
    rank: int | None,
) -> list[dict | None]:
    """The optimizer states this rank (``rank`` None: a single process) resumes from when a
    hybrid-parallel run is involved in saving, resuming, or both.

    The same sharding resumes each rank's own states. Otherwise each table optimizer's state is cut
    for this rank's table parameters from the saved ones (``rank_optimizers``: every rank's states of a
    run that wrote ``sharding``; else ``saved``, a single-process run's), and the other optimizers, whose
    states are the same on every rank, take ``saved`` as it is.
    """
    same = isinstance(model, HybridModel) and sharding == model.sharding_key()
    if same and rank_optimizers is not None:
        return rank_optimizers[rank]
    sources = rank_optimizers if sharding is not None and rank_optimizers is not None else [saved]
    if any(len(states) != len(optimizers) for states in sources):
        raise ValueError(
            "the checkpoint's optimizers do not match this run's (a rank of the run that wrote it held no table "
            "of some part); resume it with the same torchrun layout and sharding"
        )
    regions = _target_regions(model)
    out: list[dict | None] = []
    for k, (opt, state) in enumerate(zip(optimizers, saved)):
        if not opt.is_table_optimizer:
            out.append(state)
            continue
        pieces = []
        for r, states in enumerate(sources):
            where = _source_regions(model, opt.is_wide, sharding if rank_optimizers is not None else None, r)
            group = states[k]["param_groups"]
            indices = [i for g in group for i in g["params"]]
            if len(indices) != len(where):
                raise ValueError("the checkpoint's table optimizer states do not match its sharding")
            pieces += [(region, states[k]["state"].get(i, {})) for region, i in zip(where, indices)]
        params = [p for g in opt.param_groups for p in g["params"]]
        cut = {i: _cut(regions[id(p)], pieces) for i, p in enumerate(params)}
        group = {**state["param_groups"][0], "params": list(range(len(params)))}
        out.append({"state": {i: s for i, s in cut.items() if s is not None}, "param_groups": [group]})
    return out
