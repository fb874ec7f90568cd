"""An EmbeddingCollection split over ranks by a ShardingPlan, with the interface of the original.

Input distribution by all-to-all, as TorchRec and Merlin Distributed-Embeddings do it: each rank sends
every other rank only the ids of the features that rank holds shards of (for a multi-hot feature, its
bags' lengths, then their ids), so a rank receives the ids of its own tables for the global batch and no
others. It looks up its shards, and a second all-to-all hands every rank the vectors of its own samples;
row-wise shards contribute zeros for ids outside their rows, so their pieces are summed, column-wise
pieces are placed side by side.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ctrkit.data.batch import MultiHot
from ctrkit.distributed.all_to_all import all_to_all
from ctrkit.distributed.env import collective_device
from ctrkit.distributed.planner import Shard, ShardingPlan
from ctrkit.models.embeddings import EmbeddingBagCollection, EmbeddingCollection


def gather_sizes(n: int) -> list[int]:
    """Every rank's ``n`` (its number of samples), in rank order."""
    device = collective_device()
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([n], dtype=torch.int64, device=device))
    return [int(s) for s in sizes]


class ShardedEmbeddingCollection(nn.Module):
    """This rank's shards of ``source`` (an EmbeddingCollection with the full tables).

    Args:
        source: the single-process module; its weights (or, built ``storage.DEFERRED``, its
            initialisation) give the shards their starting values, so a sharded model starts exactly
            where the single-process one does.
        plan: where each shard lives.
        rank: this rank.

    Shapes: ids (B_r, F) int64 (this rank's samples) -> (B_r, F, D).
    """

    tier = None  # shards live on their rank's device, in no storage tier (``contract.TableCollection``)

    def __init__(self, source: EmbeddingCollection, plan: ShardingPlan, rank: int):
        super().__init__()
        if tuple(source.cardinalities) != plan.cardinalities or source.dim != plan.dim:
            raise ValueError("the sharding plan was made for other tables than the model's")
        self.plan, self.rank, self.dim, self.sparse = plan, rank, source.dim, source.sparse
        self.cardinalities = source.cardinalities
        self.num_features = len(source.cardinalities)
        self.features = getattr(source, "features", ())  # the model's one-hot columns these tables serve
        self.local = plan.on_rank(rank)
        self.init = source.init  # how to redraw any shard, without the whole tables
        self.shards = nn.ParameterList(nn.Parameter(self._initial(source, s)) for s in self.local)
        # per rank, the shards that serve other ranks' samples (the plan is fixed: computed once, not per batch)
        self._exchanged = [plan.exchanged_on_rank(r) for r in range(plan.world_size)]
        self._widths = [sum(s.width for s in shards) for shards in self._exchanged]
        # the features each rank holds a (not replicated) shard of: the only ids it is sent
        self._features = [sorted({s.feature for s in shards}) for shards in self._exchanged]
        self._column = {f: i for i, f in enumerate(self._features[rank])}
        # this rank's whole copies of the replicated tables (looked up locally), and the shards it serves
        self._replica_index = [i for i, s in enumerate(self.local) if plan.strategy[s.feature] == "replicated"]
        self._exchanged_index = [i for i, s in enumerate(self.local) if plan.strategy[s.feature] != "replicated"]

    @torch.no_grad()
    def reset_tables(self, draw: int = 0) -> None:
        """Draws this rank's shards' initial values (``draw`` > 0: another set of them), equal to the same
        rows and columns of the single-process tables' draw."""
        for s, w in zip(self.local, self.shards):
            self.init.fill(w, s.feature, s.row_lo, s.row_hi, s.col_lo, s.col_hi, draw)

    @staticmethod
    def _initial(source: EmbeddingCollection, s: Shard) -> torch.Tensor:
        """A shard's starting values: drawn alone when the source's tables were deferred (meta), else
        copied out of them; the same values either way."""
        if source.weight.is_meta:
            out = torch.empty(s.row_hi - s.row_lo, s.col_hi - s.col_lo)
            return source.init.fill(out, s.feature, s.row_lo, s.row_hi, s.col_lo, s.col_hi)
        return source.table(s.feature)[s.row_lo : s.row_hi, s.col_lo : s.col_hi].detach().clone()

    @torch.no_grad()
    def admitted_rows(self, fresh: dict[int, np.ndarray]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Rows of dynamic tables newly given to an id (table -> rows; the same on every rank): (this rank's shard,
        its local rows among them, the values they start from: their columns of the table's rare row, row 0,
        summed over the ranks that hold a piece of it). A collective: every rank calls it with the same tables."""
        tables = sorted(fresh)
        rare = torch.zeros(len(tables), self.dim, device=self.shards[0].device if len(self.shards) else None)
        for s, w in zip(self.local, self.shards):
            if s.feature in fresh and s.row_lo == 0 and self.plan.strategy[s.feature] != "replicated":
                rare[tables.index(s.feature), s.col_lo : s.col_hi] = w[0]
        summed = rare.to(collective_device())
        dist.all_reduce(summed)
        rare = summed.to(rare.device)
        out = []
        for s, w in zip(self.local, self.shards):
            if s.feature not in fresh:
                continue
            rows = torch.from_numpy(fresh[s.feature]).to(w.device)
            rows = rows[(rows >= s.row_lo) & (rows < s.row_hi)] - s.row_lo
            if self.plan.strategy[s.feature] == "replicated":  # every rank a whole copy: its own rare row
                out.append((w, rows, w[0].clone()))
            elif len(rows):
                out.append((w, rows, rare[tables.index(s.feature), s.col_lo : s.col_hi].clone()))
        return out

    def _lookup(self, shard: Shard, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """(B,) ids of the shard's feature -> (B, width); zeros for ids outside a row shard."""
        if shard.row_lo == 0 and shard.row_hi == self.cardinalities[shard.feature]:
            return F.embedding(ids, weight, sparse=self.sparse)
        # only the ids inside the shard are looked up, so the gradient touches no other row (a zero
        # gradient row would still move Adam's moments)
        inside = ((ids >= shard.row_lo) & (ids < shard.row_hi)).nonzero().squeeze(1)  # (n_in,)
        rows = F.embedding(ids[inside] - shard.row_lo, weight, sparse=self.sparse)  # (n_in, width)
        return weight.new_zeros((ids.shape[0], shard.width)).index_copy(0, inside, rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        sizes = gather_sizes(ids.shape[0])  # samples per rank
        mine_f = self._features[self.rank]
        send = torch.cat([ids[:, fs].reshape(-1) for fs in self._features])  # per destination: (B_self, F_dest)
        got = all_to_all(send, [ids.shape[0] * len(fs) for fs in self._features], [n * len(mine_f) for n in sizes])
        every = got.view(sum(sizes), len(mine_f))  # (B, F_self): this rank's features of the global batch
        # (B, W_self): this rank's columns for every sample
        mine = [
            self._lookup(self.local[i], self.shards[i], every[:, self._column[self.local[i].feature]])
            for i in self._exchanged_index
        ]
        # replicated tables: this rank's own samples, looked up in its copy
        local = [
            (self.local[i], F.embedding(ids[:, self.local[i].feature], self.shards[i], sparse=self.sparse))
            for i in self._replica_index
        ]
        return self._exchange(mine, sizes, local)  # (B_r, F, D)

    def _exchange(
        self, mine: list[torch.Tensor], sizes: list[int], local: list[tuple[Shard, torch.Tensor]] = ()
    ) -> torch.Tensor:
        """This rank's (B, width) shard outputs for the global batch -> (B_r, F, D) for its own samples
        (``local``: pieces already computed for them, the replicated tables')."""
        total = sum(sizes)
        own = torch.cat(mine, 1) if mine else torch.zeros((total, 0), device=collective_device())  # no shard here
        if torch.is_grad_enabled() and not own.requires_grad:
            # a rank serving no shard still takes part in the backward all-to-all its peers run
            own.requires_grad_(True)
        pieces = own.split(sizes, 0)  # per destination: (B_dest, W_self)
        send = [p.numel() for p in pieces]
        recv = [sizes[self.rank] * w for w in self._widths]
        got = all_to_all(torch.cat([p.reshape(-1) for p in pieces]), send, recv)
        n = sizes[self.rank]
        out = list(local)
        for shards, width, block in zip(self._exchanged, self._widths, got.split(recv)):
            if shards:  # one split, whose backward is one cat (a slice per shard would each allocate the block)
                out.extend(zip(shards, block.view(n, width).split([s.width for s in shards], 1)))
        return self._assemble(out, n)  # (B_r, F, D)

    def _assemble(self, pieces: list[tuple[Shard, torch.Tensor]], n: int) -> torch.Tensor:
        per_feature: list[list[tuple[Shard, torch.Tensor]]] = [[] for _ in range(self.num_features)]
        for s, t in pieces:
            per_feature[s.feature].append((s, t))
        columns = []
        for f, parts in enumerate(per_feature):
            if self.plan.strategy[f] == "row":
                columns.append(torch.stack([t for _, t in parts]).sum(0))  # (B_r, D)
            else:
                columns.append(torch.cat([t for _, t in sorted(parts, key=lambda p: p[0].col_lo)], 1))
        return torch.stack(columns, 1)  # (B_r, F, D)

    @torch.no_grad()
    def sync_gradients(self) -> None:
        """Sums the replicated tables' gradients over ranks (one all-reduce), after backward and before the
        optimizers step: each copy then gets the gradient of the global batch, with the rows any rank looked
        up (as the single-process sparse gradient has them, so row-lazy optimizers update the same rows)."""
        if not self._replica_index:
            return
        weights = [self.shards[i] for i in self._replica_index]
        parts = []
        for w in weights:
            dense = torch.zeros_like(w)  # (card, D)
            touched = torch.zeros((w.shape[0], 1), dtype=w.dtype, device=w.device)
            g = w.grad
            if g is not None and g.is_sparse:
                g = g.coalesce()
                rows = g.indices()[0]
                dense.index_add_(0, rows, g.values())
                touched[rows] = 1.0
            elif g is not None:
                dense += g
                touched += 1.0
            parts.append(torch.cat([dense, touched], 1))
        flat = torch.cat([p.reshape(-1) for p in parts]).to(collective_device())
        dist.all_reduce(flat)
        start = 0
        for w, p in zip(weights, parts):
            summed = flat[start : start + p.numel()].view(p.shape).to(w.device)
            start += p.numel()
            grad, touched = summed[:, :-1], summed[:, -1]
            if self.sparse:
                rows = (touched > 0).nonzero().squeeze(1)
                w.grad = torch.sparse_coo_tensor(
                    rows.unsqueeze(0), grad[rows], w.shape, check_invariants=False
                ).coalesce()
            else:
                w.grad = grad.contiguous()

    def table_parameters(self) -> list[nn.Parameter]:
        """The shards: embedding tables to the optimizers (sparse row updates)."""
        return list(self.shards)

    @torch.no_grad()
    def load_full_tables(self, flat: torch.Tensor) -> None:
        """Copies this rank's shards out of the flat (sum of cardinalities, D) weight of whole tables (a
        tensor, or a ``checkpoint.ShardedTableView`` over a sharded checkpoint's rank files, which a shard
        on the CPU is read into directly, block by block)."""
        offsets = [sum(self.cardinalities[:f]) for f in range(self.num_features)]
        for s, w in zip(self.local, self.shards):
            off = offsets[s.feature]
            if hasattr(flat, "read_block") and w.device.type == "cpu" and w.dtype == torch.float32:
                w.zero_()
                flat.read_block(w.detach().numpy(), off + s.row_lo, s.col_lo)
            else:
                w.copy_(flat[off + s.row_lo : off + s.row_hi, s.col_lo : s.col_hi])

    @torch.no_grad()
    def full_tables(self, dst: int = 0) -> torch.Tensor | None:
        """Every table, whole, on rank ``dst`` (the flat (sum of cardinalities, D) weight of the source,
        on the CPU); None on the other ranks, which send ``dst`` their shards and never hold more."""
        shards = [w.detach() for w in self.shards]
        world = self.plan.world_size
        offsets = [sum(self.cardinalities[:f]) for f in range(self.num_features)]
        if world > 1 and self.rank != dst:
            for w in shards:
                dist.send(w.contiguous(), dst)
            return None
        flat = torch.zeros(sum(self.cardinalities), self.dim)
        for s, w in zip(self.local, shards):
            off = offsets[s.feature]
            flat[off + s.row_lo : off + s.row_hi, s.col_lo : s.col_hi] = w.cpu()
        device = shards[0].device if shards else collective_device()
        for r in range(world):
            if r == self.rank:
                continue
            for s in self.plan.on_rank(r):
                piece = torch.empty(s.row_hi - s.row_lo, s.width, device=device)
                dist.recv(piece, r)
                off = offsets[s.feature]
                flat[off + s.row_lo : off + s.row_hi, s.col_lo : s.col_hi] = piece.cpu()
        return flat


class ShardedEmbeddingBagCollection(ShardedEmbeddingCollection):
    """An EmbeddingBagCollection (multi-hot features, sum or mean pooling) split over ranks.

    Each rank is sent the bags of the features it holds shards of (their lengths, then their ids), pools
    its shards over them (a row shard sums the ids it holds; a mean divides by the whole bag's length),
    and the same all-to-all as for one-hot features hands every rank its samples' pooled vectors.

    Shapes: multi_hot (Fm features, B_r samples) -> (B_r, Fm, D).
    """

    def __init__(self, source: EmbeddingBagCollection, plan: ShardingPlan, rank: int):
        super().__init__(source, plan, rank)
        self.is_mean = [c == "mean" for c in source.combiners]

    def forward(self, multi_hot: MultiHot) -> torch.Tensor:
        fm = self.num_features
        n = (multi_hot.offsets.numel() - 1) // fm
        sizes = gather_sizes(n)
        world = len(sizes)
        offsets = multi_hot.offsets
        lengths = (offsets[1:] - offsets[:-1]).view(fm, n)  # (Fm, B_self)
        mine_f = self._features[self.rank]
        # the lengths of every destination's features' bags, then their ids, feature-major per destination
        send_lengths = torch.cat([lengths[fs].reshape(-1) for fs in self._features])
        recv_lengths = [m * len(mine_f) for m in sizes]
        got_lengths = all_to_all(send_lengths, [n * len(fs) for fs in self._features], recv_lengths)
        per_source = [b.view(len(mine_f), m) for b, m in zip(got_lengths.split(recv_lengths), sizes)]  # (F_self, B_r)
        bounds = offsets[::n][: fm + 1].tolist() if n else [0] * (fm + 1)  # feature f's ids: bounds[f]..bounds[f+1]
        send_ids = torch.cat([multi_hot.ids[bounds[f] : bounds[f + 1]] for fs in self._features for f in fs]
                             or [multi_hot.ids[:0]])  # fmt: skip
        send_counts = [sum(bounds[f + 1] - bounds[f] for f in fs) for fs in self._features]
        # ids per (source rank, feature of this rank), read to the host once
        counts = torch.stack([b.sum(1) for b in per_source]).tolist() if mine_f else [[] for _ in sizes]
        got_ids = all_to_all(send_ids, send_counts, [sum(c) for c in counts])
        per_feature = got_ids.split([c for row in counts for c in row])  # (source, feature) order
        # per feature of this rank: the global batch's ids in rank order, each id's bag and each bag's length
        features = []
        for i in range(len(mine_f)):
            ids = torch.cat([per_feature[r * len(mine_f) + i] for r in range(world)])  # (nnz_f,)
            bag_len = torch.cat([per_source[r][i] for r in range(world)])  # (B,)
            bag = torch.repeat_interleave(torch.arange(len(bag_len), device=bag_len.device), bag_len)  # (nnz_f,)
            features.append((ids, bag_len, bag))
        mine = []
        for shard, weight in zip(self.local, self.shards):
            f = shard.feature
            ids, bag_len, bag = features[self._column[f]]
            inside = ((ids >= shard.row_lo) & (ids < shard.row_hi)).nonzero().squeeze(1)
            rows = F.embedding(ids[inside] - shard.row_lo, weight, sparse=self.sparse)  # (n_in, width)
            pooled = weight.new_zeros((len(bag_len), shard.width)).index_add(0, bag[inside], rows)  # (B, width)
            if self.is_mean[f]:
                pooled = pooled / bag_len.clamp_min(1).unsqueeze(1).to(pooled.dtype)
            mine.append(pooled)
        return self._exchange(mine, sizes)  # (B_r, Fm, D)
