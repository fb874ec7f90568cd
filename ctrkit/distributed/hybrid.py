"""Hybrid parallelism around an unchanged single-process model.

Every embedding collection of the model (``<part>.onehot`` and, with multi-hot features,
``<part>.bags`` of each CategoricalEmbeddings: the embeddings of DLRM and DCNv2, and both the deep
and the wide tables of Wide & Deep) is swapped for this rank's shards (model parallel); every other
parameter is replicated (data parallel, DistributedDataParallel) and its gradients are summed over
ranks during each backward pass. Losses are sums over a rank's samples
divided by the global batch size, so the summed gradients are exactly the single-process gradients
of the global batch's mean loss, whatever the split of the batch over ranks (an uneven last batch
included).
"""

from __future__ import annotations

import inspect
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ctrkit.config import ParallelConfig
from ctrkit.distributed.env import DistEnv
from ctrkit.distributed.planner import ShardingPlan, plan_sharding
from ctrkit.distributed.sharded_embeddings import ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from ctrkit.models.embeddings import CategoricalEmbeddings


def sharded_collections(model: nn.Module) -> dict[str, CategoricalEmbeddings]:
    """The model's CategoricalEmbeddings by attribute path ("embeddings", "wide_embeddings", ...)."""
    from ctrkit.models.inputs import MixedWidthEmbeddings

    if any(isinstance(m, MixedWidthEmbeddings) for m in model.modules()):
        raise ValueError(
            "per-feature embedding widths (embedding_dims, --embedding-sizes) train in one process: hybrid-parallel "
            "sharding plans tables of one width per collection; drop them or train without torchrun"
        )
    found = {name: m for name, m in model.named_modules() if isinstance(m, CategoricalEmbeddings)}
    if not found:
        raise ValueError(f"{type(model).__name__} has no categorical embeddings to shard")
    return found


def table_collections(model: nn.Module) -> dict[str, nn.Module]:
    """Every table collection to shard, by plan key: "<part>" for one-hot, "<part>.bags" for multi-hot."""
    out: dict[str, nn.Module] = {}
    for name, m in sharded_collections(model).items():
        out[name] = m.onehot
        if m.bags is not None:
            out[f"{name}.bags"] = m.bags
    return out


def plan_model(
    model: nn.Module,
    world_size: int,
    strategy: str = "auto",
    column_split_dim: int | None = None,
    row_budget_bytes: int | None = None,
    replicate_below_bytes: int | None = None,
) -> dict[str, ShardingPlan]:
    """A sharding plan per embedding collection of ``model`` (collections too narrow to split by
    columns over ``world_size`` ranks, such as Wide & Deep's width-1 wide tables, go table-wise; only
    one-hot collections replicate small tables, multi-hot ones shard every table)."""
    plans = {}
    for name, tables in table_collections(model).items():
        s = "table" if strategy == "column" and tables.dim < world_size else strategy
        replicate = None if name.endswith(".bags") else replicate_below_bytes
        plans[name] = plan_sharding(
            tables.cardinalities, tables.dim, world_size, s, column_split_dim, row_budget_bytes,
            replicate_below_bytes=replicate,
        )  # fmt: skip
    return plans


def describe_plans(plans: dict[str, ShardingPlan]) -> str:
    return "\n".join(f"[{name}] {plan.describe()}" for name, plan in plans.items())


def _sum_gradients(state, bucket):  # no annotations: DDP checks them, and these would be strings here
    """DDP communication hook: sum the bucket (a dist.GradBucket) over ranks; DDP's default averages."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


# no buffer broadcast before every forward: `forward_sync_buffers` from torch 2.13 on, `broadcast_buffers`
# (deprecated there) before it
_NO_FORWARD_BUFFER_SYNC = {
    ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
     else "broadcast_buffers"): False
}  # fmt: skip


def take_shards(model: nn.Module, plans: dict[str, ShardingPlan], rank: int) -> tuple[str, ...]:
    """Replaces ``model``'s embedding collections (in place) by rank ``rank``'s shards of them; returns
    the state-dict prefixes of the sharded tables."""
    collections = sharded_collections(model)
    if set(plans) != set(table_collections(model)):
        raise ValueError(f"plans for {sorted(plans)} but the model's tables are {sorted(table_collections(model))}")
    for name, m in collections.items():
        m.onehot = ShardedEmbeddingCollection(m.onehot, plans[name], rank)
        if m.bags is not None:
            m.bags = ShardedEmbeddingBagCollection(m.bags, plans[f"{name}.bags"], rank)
    return tuple(f"{name}.{part}." for name in collections for part in ("onehot", "bags"))


def load_whole_state(model: nn.Module, state: dict[str, torch.Tensor], sharded: tuple[str, ...]) -> None:
    """Loads a single-process state dict (whole tables) into a model whose tables hold shards (see
    ``take_shards``, which returns ``sharded``): other weights as they are, each table's own shards."""
    dense = {k: v for k, v in state.items() if not k.startswith(sharded)}
    missing, unexpected = model.load_state_dict(dense, strict=False)
    if unexpected or any(not k.startswith(sharded) for k in missing):
        raise ValueError(f"state dict does not fit the model: missing {missing}, unexpected {unexpected}")
    for name, m in sharded_collections(model).items():
        m.onehot.load_full_tables(state[f"{name}.onehot.weight"])
        if m.bags is not None:
            m.bags.load_full_tables(state[f"{name}.bags.weight"])


class HybridModel(nn.Module):
    """``model`` with sharded embedding tables and its dense part in DistributedDataParallel.

    Args:
        model: a ctrkit model (DLRM, DCNv2, Wide & Deep); it is modified in place.
        plans: a plan per embedding collection (see ``plan_model``).
        rank: this rank.
    """

    def __init__(self, model: nn.Module, plans: dict[str, ShardingPlan], rank: int, device=None):
        super().__init__()
        self._sharded = take_shards(model, plans, rank)
        if device is not None:  # the shards were made on the CPU (and a deferred model's tables are gone)
            model.to(device)
        self.model = model
        self.plans = plans
        self.rank = rank
        sharded = [n for n, _ in model.named_parameters() if n.startswith(self._sharded)]
        DDP._set_params_and_buffers_to_ignore_for_model(model, sharded)  # model parallel: not replicated
        device = next(model.parameters()).device
        # DDP broadcasts rank 0's dense weights at construction and all-reduces dense gradients in buckets
        # during backward, summed (not averaged): each rank's loss is its sum over the global batch size
        self.ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None, **_NO_FORWARD_BUFFER_SYNC)
        self.ddp.register_comm_hook(None, _sum_gradients)

    def forward(self, numerical: torch.Tensor | None, categorical: torch.Tensor, multi_hot=None) -> torch.Tensor:
        return self.ddp(numerical, categorical, multi_hot)  # (B_r,) logits of this rank's samples

    def sync_gradients(self) -> None:
        """After backward: sums the replicated tables' gradients over ranks (the dense part's DDP has
        summed during backward, the sharded tables need nothing)."""
        for m in sharded_collections(self.model).values():
            m.onehot.sync_gradients()

    def wide_parameters(self) -> list[nn.Parameter]:
        """The model's first-order part (its own optimizer's), shards included, as the model names it."""
        return self.model.wide_parameters() if hasattr(self.model, "wide_parameters") else []

    def sharding_key(self) -> dict[str, list[list[int]]]:
        """The placement of every shard (stored in checkpoints to recognise the same sharding)."""
        return {name: plan.key() for name, plan in self.plans.items()}

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Loads a single-process state dict (whole tables): replicated weights as they are, and from each
        table this rank's shards."""
        load_whole_state(self.model, state, self._sharded)

    def full_state_dict(self, dst: int = 0) -> dict[str, torch.Tensor] | None:
        """The single-process model's state dict (whole tables) on rank ``dst``, None on the others (which
        send their shards). Checkpoints do not use it (they are sharded); tests compare with it."""
        state = {k: v for k, v in self.model.state_dict().items() if not k.startswith(self._sharded)}
        for name, m in sharded_collections(self.model).items():
            state[f"{name}.onehot.weight"] = m.onehot.full_tables(dst)
            if m.bags is not None:
                state[f"{name}.bags.weight"] = m.bags.full_tables(dst)
        return state if self.rank == dst else None


ROW_BUDGET_FRACTION = 0.25  # of a rank's memory: the rest is for optimizer state, activations, the runtime


def default_row_budget(env: DistEnv, device: torch.device | None = None) -> int:
    """The bytes of fp32 table one rank holds before a table is split by rows: a quarter of the memory
    the rank has (the GPU's on CUDA; on CPU the host's, shared by the ranks of this node)."""
    if device is not None and device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * ROW_BUDGET_FRACTION)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(host / max(env.local_world_size, 1) * ROW_BUDGET_FRACTION)


def shard_for_job(
    model: nn.Module,
    env: DistEnv | None,
    parallel: ParallelConfig,
    state: dict[str, torch.Tensor] | None = None,
    device: torch.device | None = None,
) -> nn.Module:
    """``model`` with its tables sharded over the job's ranks (``env``; None: one process, unchanged),
    printing the plan on rank 0 when ``parallel.print_sharding_plan`` asks for it.

    ``state``: whole-table weights each rank takes its shards of (a checkpoint being resumed).
    ``device``: where the sharded model goes (its tables may have been deferred: see ``storage.DEFERRED``).
    """
    if env is None and not parallel.print_sharding_plan:
        return model
    world = env.world_size if env is not None else 1
    budget = parallel.row_budget_bytes
    if budget is None and env is not None:
        budget = default_row_budget(env, device)
    plans = plan_model(
        model, world, parallel.sharding, parallel.column_split_dim, budget, parallel.replicate_below_bytes
    )
    if parallel.print_sharding_plan and (env is None or env.is_main):
        print(describe_plans(plans), file=sys.stderr)
    if env is None:
        return model
    hybrid = HybridModel(model, plans, env.rank, device)
    ids = getattr(model, "dynamic_ids", None)
    if ids is not None:  # raw ids: every rank's maps hash under rank 0's key (a resumed state then sets its own)
        ids.share_key()
    if state is not None:
        hybrid.load_full_state_dict(state)
    return hybrid
