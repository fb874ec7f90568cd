"""Embedding tables larger than where they train: the whole table (and its optimizer state) kept in a larger,
slower home, the rows in use in a row cache where the model trains.

Two homes (``Tier``): ``disk``, a file-backed shared mapping of an unlinked file (``hugepages.file_tensor``: blocks
reserved up front, nothing left behind however the process ends), for tables larger than the CPU's memory; and
``host``, the CPU's memory, for tables larger than a GPU's, the cache on the GPU. A ``TieredTable`` backs one flat
(rows, D) table. The model's parameter is the cache: ``cache_rows`` rows on the cache's device. Each training
lookup maps the batch's flat rows to cache slots (``slots``): a row not in the cache is read from the home into a
free slot, with its optimizer state; when no slot is free, the least recently used quarter of the cache (never a row
of the current step) is written back and freed. The forward gathers from the cache, the backward's sparse gradient
names cache slots, and the optimizer updates those slots and their states in place: the same arithmetic on the same
values as the table held whole where it trains, so the results are equal bit for bit on a CPU and to float rounding
on a GPU, whose sparse updates sum a row's gradients in no fixed order (tests). Ids are power-law
distributed, so a cache of a few percent of the rows holds most lookups; the hits, misses and evictions are counted.
The slot map and the cache's bookkeeping live on the cache's device; only the rows missed and evicted cross to the
home (in row order) and back.

Reads that train nothing (validation, test, calibration) look rows up in the home with the cached rows laid over
them (``lookup``): they neither evict nor dirty the cache. ``state_dict`` writes the cached rows back and hands the
home's table out, so a checkpoint is the in-memory run's format (evaluate, export and serve read it unchanged) and
is written from the home without a second copy of the table.

On disk, the file pages are written back by the kernel and dropped under memory pressure: resident memory is the
cache plus what the page cache holds of the file, which the kernel reclaims (in a memory cgroup too).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ctrkit import hugepages

EVICT_SHARE = 4  # a full cache frees the least recently used 1/EVICT_SHARE of its slots at once
COPY_ROWS = 1 << 16  # rows copied at a time between a table and its home


HOMES = ("disk", "host")


@dataclass(frozen=True)
class Tier:
    """Where a model's one-hot tables go when built with it (``storage.on_disk``, ``storage.in_host``).

    Attributes:
        home: "disk" (files in ``directory``, unlinked at once) or "host" (the CPU's memory).
        cache_rows: rows of cache for each flat table (at most its rows).
        directory: the files' directory (``disk`` only).
        cache_device: where the cache, the model's parameter, lives: the training device (the CPU for ``disk``).
    """

    home: str
    cache_rows: int
    directory: Path | None = None
    cache_device: torch.device = torch.device("cpu")

    def __post_init__(self):
        if self.home not in HOMES:
            raise ValueError(f"a table tier's home is one of {HOMES}, not {self.home!r}")
        if self.home == "disk" and self.directory is None:
            raise ValueError("tables on disk need a directory for their files")
        if self.cache_rows < 1:
            raise ValueError(f"`embedding_cache_rows` must be at least 1, got {self.cache_rows}")


def tiers(model: torch.nn.Module) -> list[TieredTable]:
    """The tiered tables of ``model``'s embedding collections."""
    return [m.tier for m in model.modules() if getattr(m, "tier", None) is not None]


def tiered_keys(model: torch.nn.Module) -> set[str]:
    """The state-dict keys of ``model``'s tiered tables (their whole tables, which stay in their homes)."""
    return {f"{name}.weight" for name, m in model.named_modules() if getattr(m, "tier", None) is not None}


class TieredTable:
    """One flat table in its home with a row cache where it trains (the module docstring says how it works).

    Args:
        rows, dim: the table's shape.
        tier: its home, the cache's rows (at most ``rows``) and the cache's device.

    Attributes:
        table: (rows, D) the whole table, in its home (file-backed, or in the CPU's memory).
        cache: (cache_rows, D) the cached rows on ``tier.cache_device``; the collection's parameter is this tensor.
        hits, misses, evicted: rows found in the cache, read from the home, written back to free a slot.
    """

    def __init__(self, rows: int, dim: int, tier: Tier, dtype: torch.dtype = torch.float32):
        self.rows, self.dim, self.home = rows, dim, tier.home
        self.directory = None if tier.directory is None else Path(tier.directory)
        self.device = torch.device(tier.cache_device)
        self.cache_rows = max(1, min(int(tier.cache_rows), rows))
        self.table = self._home_tensor((rows, dim), dtype)
        here = {"device": self.device}
        if self.device.type == "cpu":
            self.cache = hugepages.empty(self.cache_rows, dim, dtype=dtype)
        else:
            self.cache = torch.empty(self.cache_rows, dim, dtype=dtype, **here)
        index = torch.int32 if self.cache_rows < 2**31 else torch.int64
        self.slot_of = torch.full((rows,), -1, dtype=index, **here)  # each row's slot (-1: not cached)
        self.row_of = torch.full((self.cache_rows,), -1, dtype=torch.int64, **here)  # each slot's row (-1: free)
        self.used = torch.zeros(self.cache_rows, dtype=torch.int64, **here)  # the step each slot was last looked up in
        self.dirty = torch.zeros(self.cache_rows, dtype=torch.bool, **here)  # trained since last written home
        self.free = torch.arange(self.cache_rows - 1, -1, -1, dtype=torch.int64, **here)  # a stack of free slots
        self.free_count = self.cache_rows
        self.states: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # optimizer state: (cached rows, home)
        self.clock = 1  # the current step (``new_step``): its rows are never evicted
        self.override: torch.Tensor | None = None  # a whole table to read instead (scoring other weights)
        self.hits = self.misses = self.evicted = 0
        self._lock = threading.Lock()  # a split step's slices map their rows from several threads

    def _home_tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An empty tensor of ``shape`` in the home, reading as zeros: a file's mapping, or the CPU's memory."""
        if self.home == "disk":
            return hugepages.file_tensor(torch.empty(shape, dtype=dtype, device="meta"), self.directory)
        return hugepages.empty(*shape, dtype=dtype).zero_()  # advised to huge pages before the first write

    def _read(self, home: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` (a CPU index, read once for the table and each state) of a home tensor, on the cache's
        device: for a GPU, gathered into page-locked memory and copied from there without waiting (torch's caching
        host allocator keeps the block until the copy is done)."""
        if self.device.type == "cpu":
            return home.index_select(0, rows)
        staged = torch.empty((len(rows), *home.shape[1:]), dtype=home.dtype, pin_memory=True)
        torch.index_select(home, 0, rows, out=staged)
        return staged.to(self.device, non_blocking=True)

    def _write(self, home: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
        """Writes ``values`` (on the cache's device) to rows ``rows`` (a CPU index, in row order) of a home
        tensor."""
        home.index_copy_(0, rows, values.cpu())

    # --- training lookups -------------------------------------------------------------------------------------
    def new_step(self) -> None:
        """Starts a step: rows looked up from now on stay cached until it ends."""
        self.clock += 1

    @torch.no_grad()
    def slots(self, flat: torch.Tensor) -> torch.Tensor:
        """The cache slots of flat table rows ``flat`` (any shape, int64, on the cache's device), reading missing
        rows in."""
        with self._lock:
            rows, inverse = torch.unique(flat.reshape(-1), return_inverse=True)
            if len(rows) and (int(rows[0]) < 0 or int(rows[-1]) >= self.rows):
                raise IndexError(f"rows {int(rows[0])}..{int(rows[-1])} outside a table of {self.rows} rows")
            found = self.slot_of[rows].to(torch.int64)
            miss = found < 0
            hit_slots = found[~miss]
            self.used[hit_slots] = self.clock  # before any eviction: this step's rows stay
            wanted = rows[miss]
            n = len(wanted)
            self.hits += len(rows) - n
            self.misses += n
            if n:
                if n > self.free_count:
                    self._evict(n - self.free_count)
                new = self.free[self.free_count - n : self.free_count].clone()
                self.free_count -= n
                at = wanted.cpu()  # the home's index, once for the table and its states
                self.cache.index_copy_(0, new, self._read(self.table, at))
                for cached, stored in self.states.values():
                    cached.index_copy_(0, new, self._read(stored, at))
                self.slot_of[wanted] = new.to(self.slot_of.dtype)
                self.row_of[new] = wanted
                self.used[new] = self.clock
                found[miss] = new
            self.dirty[found] = True  # the step's optimizers update every row it looks up
            return found[inverse].view(flat.shape)

    def _evict(self, need: int) -> None:
        """Writes back and frees at least ``need`` slots: the least recently used ``1/EVICT_SHARE`` of the cache
        (or ``need``, if more), never one looked up in the current step."""
        candidates = ((self.row_of >= 0) & (self.used < self.clock)).nonzero().squeeze(1)
        if len(candidates) < need:
            raise RuntimeError(
                f"a step looks up more rows than the embedding cache holds ({self.cache_rows:,}): raise "
                "`embedding_cache_rows` or lower the batch size"
            )
        count = min(len(candidates), max(need, self.cache_rows // EVICT_SHARE))
        if count < len(candidates):
            ages = self.used[candidates]
            oldest = torch.kthvalue(ages, count).values
            candidates = torch.cat([candidates[ages < oldest], candidates[ages == oldest]])[:count]
        self._write_back(candidates)
        self.slot_of[self.row_of[candidates]] = -1
        self.row_of[candidates] = -1
        self.free[self.free_count : self.free_count + count] = candidates
        self.free_count += count
        self.evicted += count

    def _write_back(self, slots: torch.Tensor, weights: bool = True, states: bool = True) -> None:
        """Writes the cached rows of ``slots`` trained since they were last written (and their states) home, in row
        order; with both ``weights`` and ``states``, they are clean after."""
        slots = slots[self.dirty[slots]]
        if len(slots) == 0:
            return
        if weights and states:
            self.dirty[slots] = False
        rows = self.row_of[slots]
        order = torch.argsort(rows)
        slots, rows = slots[order], rows[order].cpu()
        if weights:
            self._write(self.table, rows, self.cache.index_select(0, slots))
        if states:
            for cached, stored in self.states.values():
                self._write(stored, rows, cached.index_select(0, slots))

    def _occupied(self) -> torch.Tensor:
        return (self.row_of >= 0).nonzero().squeeze(1)

    # --- reads that train nothing ------------------------------------------------------------------------------
    @torch.no_grad()
    def lookup(self, flat: torch.Tensor) -> torch.Tensor:
        """The vectors of flat rows ``flat`` (any shape, on the cache's device) -> shape + (D,), on the cache's
        device: from the home, cached rows laid over (or from ``override``). The cache is left as it was."""
        f = flat.reshape(-1)
        if self.override is not None:
            override = self.override
            return override.index_select(0, f.to(override.device)).to(self.device).view(*flat.shape, self.dim)
        found = self.slot_of[f].to(torch.int64)
        cached = found >= 0
        if bool(cached.all()):
            return self.cache.index_select(0, found).view(*flat.shape, self.dim)
        out = torch.empty(len(f), self.dim, dtype=self.cache.dtype, device=self.device)
        out[cached] = self.cache.index_select(0, found[cached])
        missing = ~cached
        out[missing] = self._read(self.table, f[missing].cpu())  # only the rows the cache lacks are read from home
        return out.view(*flat.shape, self.dim)

    # --- whole tables: checkpoints, restores, redraws ----------------------------------------------------------
    @torch.no_grad()
    def flush(self) -> None:
        """Writes every cached row and state back home (the cache keeps them)."""
        with self._lock:
            self._write_back(self._occupied())

    @torch.no_grad()
    def load_table(self, source: torch.Tensor) -> None:
        """Replaces the table by ``source`` (rows, D); the cached states are written back, the cache emptied."""
        if source.data_ptr() == self.table.data_ptr():
            return
        with self._lock:
            self._write_back(self._occupied(), weights=False)
            self._clear()
            _copy_rows(self.table, source)

    @torch.no_grad()
    def load_state(self, name: str, source: torch.Tensor) -> torch.Tensor:
        """Replaces optimizer state ``name``'s whole home tensor by ``source`` (rows, ...); the cached rows are written
        back, the cache emptied. Returns the cache-shaped state tensor the optimizer keeps."""
        with self._lock:
            self._write_back(self._occupied(), states=False)
            for other in [k for k in self.states if k != name]:
                cached, stored = self.states[other]
                self._write_back_state(cached, stored)
            self._clear()
            if name not in self.states:
                cached = torch.empty((self.cache_rows, *source.shape[1:]), dtype=source.dtype, device=self.device)
                self._attach(name, cached, fill=False)
            cached, stored = self.states[name]
            _copy_rows(stored, source)
            return cached

    def _write_back_state(self, cached: torch.Tensor, stored: torch.Tensor) -> None:
        occupied = self._occupied()
        if len(occupied):
            self._write(stored, self.row_of[occupied].cpu(), cached.index_select(0, occupied))

    @torch.no_grad()
    def reset(self, fill) -> None:
        """Redraws the table (``fill(table)`` writes it) and forgets the optimizer states: the cache emptied."""
        with self._lock:
            self._clear()
            self.states.clear()
            fill(self.table)

    def _clear(self) -> None:
        occupied = self._occupied()
        if len(occupied):
            self.slot_of[self.row_of[occupied]] = -1
        self.row_of.fill_(-1)
        self.dirty.fill_(False)
        self.free = torch.arange(self.cache_rows - 1, -1, -1, dtype=torch.int64, device=self.device)
        self.free_count = self.cache_rows

    # --- optimizer state ---------------------------------------------------------------------------------------
    def attach(self, state: dict) -> None:
        """Keeps an optimizer's new state tensors of this table's cache (first dimension ``cache_rows``) in the
        home: each gets a home tensor of the table's rows, every row set to the tensor's first row (the initial
        value)."""
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == self.cache_rows:
                if name not in self.states or self.states[name][0] is not value:
                    self._attach(name, value, fill=True)

    def _attach(self, name: str, cached: torch.Tensor, fill: bool) -> None:
        stored = self._home_tensor((self.rows, *cached.shape[1:]), cached.dtype)
        if fill and len(cached) and bool((cached[0] != 0).any()):  # a new home tensor reads as zeros
            first = cached[:1].cpu()
            for lo in range(0, self.rows, COPY_ROWS):
                stored[lo : lo + COPY_ROWS].copy_(first.expand(min(COPY_ROWS, self.rows - lo), *cached.shape[1:]))
        self.states[name] = (cached, stored)

    @torch.no_grad()
    def whole_state(self, name: str) -> torch.Tensor:
        """State ``name`` of every row (its home tensor, the cached rows written back first)."""
        cached, stored = self.states[name]
        with self._lock:
            self._write_back_state(cached, stored)
        return stored


def _copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` in blocks of rows (a memory-mapped source is read a block at a time)."""
    if dst.shape != src.shape:
        raise ValueError(f"a table of shape {tuple(src.shape)} does not fit one of {tuple(dst.shape)}")
    for lo in range(0, dst.shape[0], COPY_ROWS):
        dst[lo : lo + COPY_ROWS].copy_(src[lo : lo + COPY_ROWS])
