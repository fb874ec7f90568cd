"""Resuming optimizer states when a hybrid-parallel run is involved: the right ones picked (or refused),
whatever the world size the checkpoint was written at."""

from __future__ import annotations

import torch

from ctrkit.distributed.hybrid import HybridModel


def optimizer_states_for_rank(
    optimizers: list[torch.optim.Optimizer],
    saved: list[dict],
    rank_optimizers: list | None,
    sharding: dict | None,
    model: torch.nn.Module,
    rank: int | None,
) -> list[dict | None]:
    """The optimizer states this rank resumes from when a hybrid-parallel run is involved (saving,
    resuming, or both); None where an optimizer starts afresh.

    The same sharding resumes exactly (each rank takes its own states). Otherwise table optimizers
    can only restart if they keep no state (SGD); stateful ones are refused.
    """
    same = isinstance(model, HybridModel) and sharding == model.sharding_key()
    if same and rank_optimizers is not None:
        return rank_optimizers[rank]
    out: list[dict | None] = []
    for opt, state in zip(optimizers, saved):
        if not getattr(opt, "is_table_optimizer", False):
            out.append(state)
        elif any(state["state"].values()):
            raise ValueError(
                "the checkpoint's embedding optimizer state was sharded differently (another world size or "
                "sharding); resume it with the same torchrun layout and sharding, or use an optimizer without "
                "state for the tables (sgd). Evaluation, export and serving load it at any world size."
            )
        else:
            out.append(None)
    return out


def write_sharded_checkpoint(ckpt, path, world_size: int, parallel) -> list[int]:
    """Writes ``ckpt`` (one file, or sharded at any layout) in the sharded form a ``world_size``-rank
    run with ``parallel``'s sharding writes: a file per rank holding its shards and the replicated
    weights, then the manifest (last). Returns the bytes of table each rank holds.

    Only one rank's part is in memory at a time, the source's tables staying memory-mapped. Optimizer
    states are not converted (their layout follows the optimizer); a resume from the result refuses
    stateful optimizers with an explanation, and every other reader loads it.
    """
    from dataclasses import replace
    from pathlib import Path

    from ctrkit.checkpoint import assemble_shards, rank_file_name, save_checkpoint
    from ctrkit.data.atomic import atomic_file
    from ctrkit.distributed.hybrid import load_whole_state, plan_model, take_shards
    from ctrkit.models.embeddings import deferred_tables
    from ctrkit.models.registry import create_model, make_config

    if world_size < 1:
        raise ValueError(f"`world_size`: expected an integer >= 1, got {world_size}")
    path = Path(path)
    whole = assemble_shards(ckpt) if ckpt.shard_files else ckpt

    def build() -> torch.nn.Module:
        with deferred_tables():
            return create_model(ckpt.model_name, make_config(ckpt.model_name, ckpt.model_config))

    plans = plan_model(
        build(), world_size, parallel.sharding, parallel.column_split_dim, parallel.row_budget_bytes,
        parallel.replicate_below_bytes,
    )  # fmt: skip
    names = [rank_file_name(path, whole.step, r, world_size) for r in range(world_size)]
    held = []
    for rank in range(world_size):
        model = build()
        sharded = take_shards(model, plans, rank)
        part: dict = {"optimizers": None}  # see the docstring: a resume refuses stateful optimizers
        for which, state in (("model", whole.model), ("resume_model", whole.resume_model)):
            if state is not None:
                load_whole_state(model, state, sharded)
            part[which] = None if state is None else {k: v.detach().clone() for k, v in model.state_dict().items()}
        held.append(sum(
            p.numel() * p.element_size() for n, p in model.named_parameters() if ".shards." in n
        ))  # fmt: skip
        (path.parent / names[rank]).parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path.parent / names[rank]) as tmp:
            torch.save(part, tmp)
        del model, part
    manifest = replace(
        whole,
        model={},
        resume_model=None,
        optimizers=[],
        rank_optimizers=None,
        sharding={name: plan.key() for name, plan in plans.items()},
        shard_files=names,
    )
    save_checkpoint(path, manifest)
    return held
