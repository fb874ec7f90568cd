"""Checkpoint state of a hybrid-parallel run: optimizer states gathered from every rank on save, and
the right ones picked (or refused) on resume, whatever the world size the checkpoint was written at."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ctrkit.distributed.hybrid import HybridModel


def gather_rank_optimizers(model: HybridModel, optimizers: list[torch.optim.Optimizer], dst: int = 0) -> dict[str, Any]:
    """Every rank's optimizer states and the shard placement, on rank ``dst`` (every rank must call it;
    the others get empty values and hold only their own states)."""
    rank = dist.get_rank()
    every: list | None = [None] * dist.get_world_size() if rank == dst else None
    dist.gather_object([opt.state_dict() for opt in optimizers], every, dst=dst)
    return {"rank_optimizers": every, "sharding": model.sharding_key()} if rank == dst else {}


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
