"""Hybrid parallelism around an unchanged single-process model.

The model's one-hot embedding tables (``model.embeddings.onehot``) are swapped for this rank's
shards (model parallel); every other parameter is replicated (data parallel) and its gradients are
summed over ranks after each backward pass. Losses are sums over a rank's samples divided by the
global batch size, so the summed gradients are exactly the single-process gradients of the global
batch's mean loss, whatever the split of the batch over ranks (an uneven last batch included).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ctrkit.distributed.planner import ShardingPlan
from ctrkit.distributed.sharded_embeddings import ShardedEmbeddingCollection


class HybridModel(nn.Module):
    """``model`` with sharded one-hot embeddings; call ``sync_gradients()`` after every backward.

    Args:
        model: a ctrkit model (DLRM, DCNv2, ...) holding ``embeddings.onehot``; it is modified in place.
        plan: the sharding plan for its one-hot tables.
        rank: this rank.
    """

    def __init__(self, model: nn.Module, plan: ShardingPlan, rank: int):
        super().__init__()
        embeddings = getattr(model, "embeddings", None)
        if embeddings is None or not hasattr(embeddings, "onehot"):
            raise ValueError(f"{type(model).__name__} has no embeddings.onehot to shard")
        if getattr(embeddings, "bags", None) is not None or hasattr(model, "wide"):
            raise ValueError(
                "hybrid-parallel training shards one-hot tables only; multi-hot features and the wide part of "
                "Wide & Deep are not supported yet"
            )
        embeddings.onehot = ShardedEmbeddingCollection(embeddings.onehot, plan, rank)
        self.model = model
        self.plan = plan
        self.rank = rank
        self._dense = [p for n, p in model.named_parameters() if not n.startswith("embeddings.onehot.")]
        with torch.no_grad():  # every rank starts from rank 0's dense weights
            for p in self._dense:
                dist.broadcast(p, 0)

    def forward(self, dense: torch.Tensor | None, sparse: torch.Tensor, multi_hot=None) -> torch.Tensor:
        return self.model(dense, sparse, multi_hot)  # (B_r,) logits of this rank's samples

    def sync_gradients(self) -> None:
        """Sums the data-parallel gradients over ranks, in one flat all-reduce."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._dense]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        for p, chunk in zip(self._dense, flat.split([g.numel() for g in grads])):
            p.grad = chunk.view_as(p).clone()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The single-process model's state dict (whole tables), identical on every rank."""
        state = {k: v for k, v in self.model.state_dict().items() if not k.startswith("embeddings.onehot.")}
        state["embeddings.onehot.weight"] = self.model.embeddings.onehot.full_tables()
        return state
