"""Where a model's embedding tables live, given to the model's builder (``registry.create_model``) and passed down
to each embedding collection it makes: in memory and drawn at once (the default), in memory and drawn later,
on the meta device for a hybrid-parallel rank to draw its shards, in files on disk with a row cache in memory, or
in the CPU's memory with a row cache on the GPU that trains them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ctrkit.models.tiered_tables import Tier


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
            memory. The values drawn later are the same: each is a function of the seed drawn at construction and its
            place (``table_draw``).
        tier: the one-hot tables kept whole in a larger home, a row cache where they train
            (``tiered_tables.TieredTable``): in files on disk, the cache in memory, or in the CPU's memory, the cache
            on a GPU; None: where the model is.
        device: where tables in memory are allocated and drawn (None: where the model is built, the CPU): a GPU
            run's tables made and drawn on its GPU (the same values as on the CPU), with no copy of them in the CPU's
            memory. The rest of the model is built on the CPU and moved, so every device starts from the same
            weights.
    """

    deferred: bool = False
    fill_later: bool = False
    tier: Tier | None = None
    device: torch.device | None = None

    def in_memory(self) -> TableStorage:
        """The same, but in memory (tables of one number a row: the first-order term's)."""
        return replace(self, tier=None)


IN_MEMORY = TableStorage()
DEFERRED = TableStorage(deferred=True)
FILLED_LATER = TableStorage(fill_later=True)


def on_device(device: str | torch.device) -> TableStorage:
    """The tables allocated and drawn on ``device`` (a GPU; the CPU's is ``IN_MEMORY``)."""
    device = torch.device(device)
    return IN_MEMORY if device.type == "cpu" else TableStorage(device=device)


def on_disk(directory: str | Path, cache_rows: int) -> TableStorage:
    """The one-hot tables in files in ``directory``, ``cache_rows`` rows of each flat table cached in memory."""
    return TableStorage(tier=Tier("disk", int(cache_rows), directory=Path(directory)))


def in_host(cache_rows: int, device: str | torch.device) -> TableStorage:
    """The one-hot tables in the CPU's memory, ``cache_rows`` rows of each flat table cached on ``device`` (the
    GPU that trains them; the CPU too, where the cache's logic is tested)."""
    return TableStorage(tier=Tier("host", int(cache_rows), cache_device=torch.device(device)))
