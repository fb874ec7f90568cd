"""Where each embedding table lives: whole on every rank, whole on one rank, split by columns, or split by rows.

A table of at most ``replicate_below_bytes`` is replicated (as Merlin Distributed-Embeddings plans small
tables): every rank holds it whole, looks up its own samples' ids in it and its gradient is summed over
ranks each step, which for small tables costs less than sending their ids and vectors between ranks.
Table-wise placement balances memory and lookups (each table goes to the rank with the least load,
largest tables first); a table wider than ``column_split_dim`` is split by columns into blocks of that
width; a table larger than ``row_budget_bytes`` (one rank's embedding memory) is split by rows over
every rank, so a table larger than any one worker still trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

STRATEGIES = ("auto", "table", "column", "row")


@dataclass(frozen=True)
class Shard:
    """Rows [row_lo, row_hi) and columns [col_lo, col_hi) of ``feature``'s table, held by ``rank``."""

    feature: int
    rank: int
    row_lo: int
    row_hi: int
    col_lo: int
    col_hi: int

    @property
    def rows(self) -> int:
        return self.row_hi - self.row_lo

    @property
    def width(self) -> int:
        return self.col_hi - self.col_lo


@dataclass(frozen=True)
class ShardingPlan:
    """Every shard of every table; ``strategy[f]`` says how table f was split ("replicated": one whole
    copy per rank)."""

    world_size: int
    cardinalities: tuple[int, ...]
    dim: int
    shards: tuple[Shard, ...]
    strategy: tuple[str, ...]

    def key(self) -> list[list[int]]:
        """The placement as plain lists (stored in checkpoints to recognise the same sharding)."""
        return [[self.world_size]] + [[s.feature, s.rank, s.row_lo, s.row_hi, s.col_lo, s.col_hi] for s in self.shards]

    def on_rank(self, rank: int) -> tuple[Shard, ...]:
        return tuple(s for s in self.shards if s.rank == rank)

    def exchanged_on_rank(self, rank: int) -> tuple[Shard, ...]:
        """The rank's shards that serve other ranks' samples (all but the replicated tables' copies)."""
        return tuple(s for s in self.on_rank(rank) if self.strategy[s.feature] != "replicated")

    def memory_bytes(self, rank: int, bytes_per_value: int = 4) -> int:
        return sum(s.rows * s.width * bytes_per_value for s in self.on_rank(rank))

    def describe(self) -> str:
        """A table of the plan, one line per table, then the memory per rank."""
        lines = [f"sharding plan: {len(self.cardinalities)} tables, dim {self.dim}, {self.world_size} ranks"]
        for f, card in enumerate(self.cardinalities):
            parts = [s for s in self.shards if s.feature == f]
            if self.strategy[f] == "replicated":
                lines.append(f"  table {f:3d} ({card:,} x {self.dim}) replicated: every rank, data parallel")
                continue
            where = ", ".join(
                f"rank {s.rank}"
                + (f" rows {s.row_lo}:{s.row_hi}" if self.strategy[f] == "row" else "")
                + (f" cols {s.col_lo}:{s.col_hi}" if self.strategy[f] == "column" else "")
                for s in parts
            )
            lines.append(f"  table {f:3d} ({card:,} x {self.dim}) {self.strategy[f]}-wise: {where}")
        for r in range(self.world_size):
            lines.append(f"  rank {r}: {self.memory_bytes(r) / 2**20:.1f} MiB of fp32 embeddings")
        return "\n".join(lines)


def plan_sharding(
    cardinalities: Sequence[int],
    dim: int,
    world_size: int,
    strategy: str = "auto",
    column_split_dim: int | None = None,
    row_budget_bytes: int | None = None,
    bytes_per_value: int = 4,
    replicate_below_bytes: int | None = None,
) -> ShardingPlan:
    """Places every table (see the module docstring).

    Args:
        cardinalities: rows of each table.
        dim: embedding width D (every table's).
        world_size: ranks.
        strategy: "auto" (table-wise, with the column and row rules below), or force "table",
            "column" (every table split into ``world_size`` column blocks) or "row" (every table split
            by rows over every rank), for testing.
        column_split_dim: under "auto", split tables wider than this into blocks this wide.
        row_budget_bytes: under "auto", split tables larger than this by rows.
        replicate_below_bytes: under "auto" with more than one rank, replicate tables of at most this size.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"sharding strategy must be one of {', '.join(STRATEGIES)}, got '{strategy}'")
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if strategy == "column" and dim < world_size:
        raise ValueError(f"column-wise sharding needs dim >= world size, got dim {dim} for {world_size} ranks")
    load = [0] * world_size
    shards: list[Shard] = []
    kinds: list[str] = [""] * len(cardinalities)
    order = sorted(range(len(cardinalities)), key=lambda f: (-cardinalities[f], f))
    for f in order:
        card = int(cardinalities[f])
        size = card * dim * bytes_per_value
        if strategy == "auto" and world_size > 1 and replicate_below_bytes and size <= replicate_below_bytes:
            kinds[f] = "replicated"
            for r in range(world_size):
                shards.append(Shard(f, r, 0, card, 0, dim))
            continue  # the same on every rank: no part of the balance
        if strategy == "row" or (strategy == "auto" and row_budget_bytes is not None and size > row_budget_bytes):
            kinds[f] = "row"
            bounds = [card * r // world_size for r in range(world_size + 1)]
            for r in range(world_size):
                shards.append(Shard(f, r, bounds[r], bounds[r + 1], 0, dim))
                load[r] += (bounds[r + 1] - bounds[r]) * dim
            continue
        if strategy == "column" or (strategy == "auto" and column_split_dim is not None and dim > column_split_dim):
            kinds[f] = "column"
            blocks = world_size if strategy == "column" or column_split_dim is None else -(-dim // column_split_dim)
            cols = [dim * b // blocks for b in range(blocks + 1)]
            for b in range(blocks):
                r = min(range(world_size), key=lambda i: (load[i], i))
                shards.append(Shard(f, r, 0, card, cols[b], cols[b + 1]))
                load[r] += card * (cols[b + 1] - cols[b])
            continue
        kinds[f] = "table"
        r = min(range(world_size), key=lambda i: (load[i], i))
        shards.append(Shard(f, r, 0, card, 0, dim))
        load[r] += card * dim
    shards.sort(key=lambda s: (s.rank, s.feature, s.row_lo, s.col_lo))
    return ShardingPlan(world_size, tuple(int(c) for c in cardinalities), dim, tuple(shards), tuple(kinds))
