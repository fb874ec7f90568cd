"""Resuming optimizer states when a hybrid-parallel run is involved, whatever the world size or sharding
the checkpoint was written with: the table optimizers' per-row states are cut from the saved shards (or
whole tables) into this rank's shards, the other optimizers' states are the same on every rank."""

from __future__ import annotations

import uuid
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
        if not getattr(opt, "is_table_optimizer", False):
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


def converted_optimizer_states(ckpt, model: torch.nn.Module, rank: int | None) -> list[dict] | None:
    """``ckpt``'s optimizer states (one file, or a sharded checkpoint read assembled) for ``model``: the
    whole model (``rank`` None) or rank ``rank``'s shards of it, optimizers built as the checkpoint's run
    built them. None when the checkpoint holds none (a ``convert-checkpoint --world-size`` output of
    an older version) or its run kept no first-order or table part to convert."""
    from ctrkit.config import TrainConfig
    from ctrkit.train.optim import build_optimizers

    if not ckpt.optimizers or ckpt.train_config is None:
        return None
    if ckpt.rank_optimizers is not None and any(s is None for s in ckpt.rank_optimizers):
        return None
    cfg = TrainConfig.from_dict(ckpt.train_config)
    optimizers = build_optimizers(
        model, cfg.optimizer, cfg.lr, cfg.embedding_optimizer, cfg.embedding_lr, cfg.wide_optimizer, cfg.wide_lr
    )
    return optimizer_states_for_rank(optimizers, ckpt.optimizers, ckpt.rank_optimizers, ckpt.sharding, model, rank)


def write_sharded_checkpoint(ckpt, path, world_size: int, parallel) -> list[int]:
    """Writes ``ckpt`` (one file, or sharded at any layout) in the sharded form a ``world_size``-rank
    run with ``parallel``'s sharding writes: a file per rank holding its shards and the replicated
    weights, then the manifest (last). Returns the bytes of table each rank holds.

    Only one rank's part is in memory at a time, the source's tables staying memory-mapped. The
    optimizer states are cut for each rank's shards (``converted_optimizer_states``), so an N-rank run
    with that sharding resumes from the result as from its own checkpoint.
    """
    from dataclasses import replace
    from pathlib import Path

    from ctrkit.checkpoint import save_checkpoint
    from ctrkit.checkpoint_shards import assemble_shards, rank_file_name, write_rank_file
    from ctrkit.distributed.hybrid import load_whole_state, plan_model, take_shards
    from ctrkit.models.embeddings import deferred_tables
    from ctrkit.models.registry import create_model, make_config

    if world_size < 1:
        raise ValueError(f"`world_size`: expected an integer >= 1, got {world_size}")
    path = Path(path)
    whole = assemble_shards(ckpt, lazy=True) if ckpt.shard_files else ckpt  # tables read where they lie

    def build() -> torch.nn.Module:
        with deferred_tables():
            return create_model(ckpt.model_name, make_config(ckpt.model_name, ckpt.model_config))

    plans = plan_model(
        build(), world_size, parallel.sharding, parallel.column_split_dim, parallel.row_budget_bytes,
        parallel.replicate_below_bytes,
    )  # fmt: skip
    names = [rank_file_name(path, whole.step, r, world_size) for r in range(world_size)]
    held, records, run = [], [], uuid.uuid4().hex
    for rank in range(world_size):
        model = build()
        sharded = take_shards(model, plans, rank)
        part: dict = {"optimizers": converted_optimizer_states(whole, model, rank)}
        for which, state in (("model", whole.model), ("resume_model", whole.resume_model)):
            if state is not None:
                load_whole_state(model, state, sharded)
            part[which] = None if state is None else {k: v.detach().clone() for k, v in model.state_dict().items()}
        held.append(sum(
            p.numel() * p.element_size() for n, p in model.named_parameters() if ".shards." in n
        ))  # fmt: skip
        records.append(write_rank_file(path.parent / names[rank], part, run, whole.step, rank))
        del model, part
    manifest = replace(
        whole,
        model={},
        resume_model=None,
        optimizers=[],
        rank_optimizers=None,
        sharding={name: plan.key() for name, plan in plans.items()},
        shard_files=names,
        shard_records=records,
    )
    save_checkpoint(path, manifest)
    return held
