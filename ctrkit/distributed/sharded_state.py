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
