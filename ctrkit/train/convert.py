"""A checkpoint converted between one file and the sharded form of a hybrid-parallel run (``convert-checkpoint``),
optimizer states included: built as the checkpoint's run built them (``train.optim``), then cut for each rank's
shards (``distributed.sharded_state``)."""

from __future__ import annotations

import uuid

import torch

from ctrkit.distributed.sharded_state import optimizer_states_for_rank


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
    from ctrkit.models.registry import create_model, make_config
    from ctrkit.models.storage import DEFERRED

    if world_size < 1:
        raise ValueError(f"`world_size`: expected an integer >= 1, got {world_size}")
    path = Path(path)
    whole = assemble_shards(ckpt, lazy=True) if ckpt.shard_files else ckpt  # tables read where they lie

    def build() -> torch.nn.Module:
        return create_model(ckpt.model_name, make_config(ckpt.model_name, ckpt.model_config), DEFERRED)

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
        whole.resuming(model=None, optimizers=[], rank_optimizers=None),
        model={},
        sharding={name: plan.key() for name, plan in plans.items()},
        shard_files=names,
        shard_records=records,
    )
    save_checkpoint(path, manifest)
    return held
