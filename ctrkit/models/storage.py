"""Where a model's embedding tables live, given to the model's builder (``registry.create_model``) and passed down
to each embedding collection it makes: in memory and drawn at once (the default), in memory and drawn later,
on the meta device for a hybrid-parallel rank to draw its shards, or in files on disk with a row cache."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ctrkit.models.disk_tier import DiskTables


@dataclass(frozen=True)
class TableStorage:
    """Where the tables of the collections built with it live.

    Attributes:
        deferred: on the meta device (no memory, no values): a hybrid-parallel rank then draws only the rows and
            columns of its shards (``TableInit.fill``), equal to the same rows of the whole table, so any world
            size starts from the same model.
        fill_later: allocated but not drawn: their pages stay untouched (not resident) until
            ``embeddings.fill_pending_tables``, a load or a redraw writes them. A training run builds its model so,
            so that the warm start's fit (which needs only the first-order tables) does not add to the tables'
            memory. The values drawn later are the same: each block of rows has its own generator, seeded at
            construction.
        disk: the one-hot tables in files on disk, a row cache in memory (``disk_tier.DiskTier``); None: in memory.
    """

    deferred: bool = False
    fill_later: bool = False
    disk: DiskTables | None = None

    def in_memory(self) -> TableStorage:
        """The same, but in memory (tables of one number a row: the first-order term's)."""
        return replace(self, disk=None)


IN_MEMORY = TableStorage()
DEFERRED = TableStorage(deferred=True)
FILLED_LATER = TableStorage(fill_later=True)


def on_disk(directory: str | Path, cache_rows: int) -> TableStorage:
    """The one-hot tables in files in ``directory``, ``cache_rows`` rows of each flat table cached in memory."""
    if cache_rows < 1:
        raise ValueError(f"`embedding_cache_rows` must be at least 1, got {cache_rows}")
    return TableStorage(disk=DiskTables(Path(directory), int(cache_rows)))
