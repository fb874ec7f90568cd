"""Dynamic tables: raw 64-bit ids of features without a vocabulary, mapped to the rows of bounded tables.

A dynamic feature's table has ``capacity`` rows (its cardinality in the feature spec). Row 0 is the feature's
*rare row*: every id that holds no row of its own is looked up there. Each feature keeps an id -> entry map
(open addressing over a power-of-two number of slots, no collisions among the ids it holds) whose entries are

* **admitted** ids, each with its own row in ``1..capacity-1``;
* **candidates**, ids seen fewer than ``admit_after`` times, looked up as the rare row.

Training (``observe``, once per batch, before the forward) counts each id's sightings. A count decays by half every
``half_life`` observed batches (0: never), so an id seen often long ago can give way to one seen often now. A
candidate whose count reaches ``admit_after`` is admitted (highest count first, ties by smaller id); where no row
is free, admitted ids not in the batch are evicted: the lowest decayed count first (``eviction="lfu"``) or the
longest unseen (``"lru"``), ties by smaller id. An evicted id is forgotten (its count too). The admitted id's row
starts as a copy of the rare row, what the id was looked up as until then, and its optimizer state as zeros
(``reset_rows``). Candidates are bounded too: the map holds at most ``max_entries`` ids (default twice the
capacity); beyond that, the candidates with the lowest counts not in the batch are forgotten first, and new ids
that still find no room stay unknown.

Scoring (``forward``) only reads the map: an id maps to its row, any other to row 0. The map and counts are buffers
of the model (its state dict, so checkpoints, model selection's copies and resumes carry them); they stay in host
memory on whatever device the model runs.

Raw ids come from outside, so the map must not let them be chosen to collide: an id's first slot is a keyed hash
(``keyed_mix``: two rounds of SplitMix64's finaliser around a per-model secret ``hash_key`` drawn from the OS when
the model is made, stored in its state dict, shared by a job's ranks), and a lookup or insert looks at no more than
``MAX_PROBE`` slots (an id that finds no free one within them stays unknown, as when the map is full). Ids made to
collide under one key spread under another; whoever cannot read the key cannot aim at it. Two runs of the same seed
give the same rows, weights and predictions; only the slots the ids sit in differ. A state dict written before
the key existed loads with the key zero: the unkeyed mixer it was written with.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ctrkit import splitmix
from ctrkit.data.feature_spec import check_capacity

EMPTY, USED, GONE = 0, 1, 2  # slot states (GONE: a deleted entry, skipped by lookups, reused by inserts)
EVICTIONS = ("lfu", "lru")
ADMIT_AFTER = 1  # sightings before an id gets its own row (1: at once)
HALF_LIFE = 0  # observed batches in which a count halves (0: counts never decay)
# a full map makes room for at least 1/BATCHED of its rows (or ids) at once: each eviction scans the whole map
BATCHED = 64
MAX_PROBE = 64  # slots a lookup or an insert looks at, at most (at load <= 1/2 a random key set needs a handful)


def mix64(ids: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of 64-bit integers that spreads consecutive ids over the slots."""
    z = ids.astype(np.uint64, copy=True)
    return splitmix.finalise_numpy(z)


def keyed_mix(ids: np.ndarray, key: np.ndarray) -> np.ndarray:
    """``ids`` hashed under the two 64-bit words of ``key``: mix64(mix64(id ^ k0) ^ k1), in one array; a zero key
    is the unkeyed ``mix64`` of maps written before keys existed."""
    k0, k1 = (np.uint64(int(k) & (2**64 - 1)) for k in key)
    if not k0 and not k1:
        return mix64(ids)
    z = ids.astype(np.uint64, copy=True)
    scratch = np.empty_like(z)
    z ^= k0
    splitmix.finalise_numpy(z, scratch)
    z ^= k1
    return splitmix.finalise_numpy(z, scratch)


def new_key() -> torch.Tensor:
    """A fresh secret key: two nonzero 63-bit words from the OS's random source."""
    return torch.tensor([secrets.randbits(63) | 1, secrets.randbits(63) | 1], dtype=torch.int64)


def slots_for(max_entries: int) -> int:
    """The number of slots of a map holding ``max_entries`` ids: a power of two, at most half full."""
    return 1 << max(4, int(2 * max_entries - 1).bit_length())


class IdMap:
    """One dynamic feature's map, over numpy views of five arrays of ``slots`` entries (the module's buffers).

    ``keys`` the ids, ``state`` EMPTY/USED/GONE, ``row`` the id's row (0: a candidate), ``count`` its count at
    its last sighting, ``seen`` that batch's number; ``held`` marks the rows that have an id (row 0 always).
    """

    def __init__(self, keys, state, row, count, seen, held, sizes, capacity: int, max_entries: int, hint=None,
                 key=None):  # fmt: skip
        self.keys, self.state, self.row, self.count, self.seen, self.held = keys, state, row, count, seen, held
        self.key = np.zeros(2, np.int64) if key is None else key  # the hash key (zero: the unkeyed mixer)
        self.sizes = sizes  # [ids held, slots not EMPTY]
        self.capacity, self.max_entries = capacity, max_entries
        # a one-element view: every row below it is held (the search for free rows starts there; 0: anywhere)
        self.hint = hint if hint is not None else np.zeros(1, np.int64)
        self.mask = np.uint64(len(keys) - 1)

    # ------------------------------------------------------------------------------------------ lookups
    def home(self, ids: np.ndarray) -> np.ndarray:
        """The first slot each id's probe looks at."""
        return (keyed_mix(ids, self.key) & self.mask).astype(np.int64)

    def probe_lengths(self) -> np.ndarray:
        """How many slots past its first each id held sits (0: in its first), in slot order."""
        s = np.flatnonzero(self.state == USED)
        return (s - self.home(self.keys[s])) & int(self.mask)

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The slot of each of ``ids`` (distinct or not), -1 where it is not in the map (within ``MAX_PROBE``)."""
        out = np.full(len(ids), -1, np.int64)
        pos = self.home(ids)
        todo = np.arange(len(ids))
        mask = int(self.mask)
        for _ in range(MAX_PROBE):
            if not len(todo):
                break
            p = pos[todo]
            st = self.state[p]
            hit = (st == USED) & (self.keys[p] == ids[todo])
            out[todo[hit]] = p[hit]
            go_on = ~hit & (st != EMPTY)
            todo = todo[go_on]
            pos[todo] = (p[go_on] + 1) & mask
        return out

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row: its own when admitted, else 0 (the rare row)."""
        slots = self.find(ids)
        return np.where(slots >= 0, self.row[np.maximum(slots, 0)], 0).astype(np.int64)

    def _insert(self, ids: np.ndarray) -> np.ndarray:
        """Puts distinct ``ids``, none in the map, into free slots within ``MAX_PROBE`` of their first; returns their
        slots, -1 for an id that found none (left out)."""
        out = np.full(len(ids), -1, np.int64)
        pos = self.home(ids)
        todo = np.arange(len(ids))
        mask = int(self.mask)
        for _ in range(MAX_PROBE):
            if not len(todo):
                break
            p = pos[todo]
            free = self.state[p] != USED
            first = np.zeros(len(todo), bool)
            _, at = np.unique(p[free], return_index=True)  # one id per free slot this round
            first[np.flatnonzero(free)[at]] = True
            won = todo[first]
            out[won] = p[first]
            self.sizes[1] += int((self.state[p[first]] == EMPTY).sum())
            self.state[p[first]] = USED
            self.keys[p[first]] = ids[won]
            todo = todo[~first]
            pos[todo] = (p[~first] + 1) & mask
        self.sizes[0] += len(ids) - len(todo)
        return out

    def _remove(self, slots: np.ndarray) -> None:
        self.state[slots] = GONE
        self.row[slots] = 0
        self.sizes[0] -= len(slots)
        if self.sizes[1] > 0.75 * len(self.state):  # too many deleted slots: lookups slow down
            self._rehash()

    def _rehash(self) -> None:
        live = np.flatnonzero(self.state == USED)
        keys, row, count, seen = self.keys[live], self.row[live], self.count[live], self.seen[live]
        self.state[:] = EMPTY
        self.sizes[:] = 0
        slots = self._insert(keys)
        placed = slots >= 0  # an id that no longer finds a slot within MAX_PROBE is forgotten, its row freed
        self.held[row[~placed & (row > 0)]] = False
        self.row[slots[placed]], self.count[slots[placed]], self.seen[slots[placed]] = (
            row[placed], count[placed], seen[placed])  # fmt: skip

    # ---------------------------------------------------------------------------------------- training
    def decayed(self, slots: np.ndarray, now: int, half_life: int) -> np.ndarray:
        """The entries' counts decayed to batch ``now``."""
        if half_life <= 0:
            return self.count[slots]
        return self.count[slots] * np.exp2(-(now - self.seen[slots]).astype(np.float64) / half_life)

    def observe(self, ids: np.ndarray, now: int, admit_after: float, eviction: str, half_life: int
                ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """Counts one batch's ids (batch number ``now``), admits and evicts; returns the rows given to newly
        admitted ids and those ids."""
        uniq, times = np.unique(ids, return_counts=True)
        slots = self.find(uniq)
        known = slots >= 0
        ks = slots[known]
        self.count[ks] = self.decayed(ks, now, half_life) + times[known]
        self.seen[ks] = now
        new, new_times = uniq[~known], times[~known]
        slots, moved = ks, False  # the batch's ids in the map (their slots move only where a removal rehashes)
        if len(new):
            room = self.max_entries - int(self.sizes[0])
            if room < len(new):
                forgotten = self._forget_candidates(len(new) - room, uniq, now, half_life)
                room, moved = room + forgotten, forgotten > 0
            if room < len(new):  # the most often seen first, then the smaller ids
                keep = np.lexsort((new, -new_times))[: max(room, 0)]
                new, new_times = new[keep], new_times[keep]
            if len(new):
                s = self._insert(new)
                placed = s >= 0  # within MAX_PROBE slots; the others stay unknown
                s, new_times = s[placed], new_times[placed]
                self.row[s], self.count[s], self.seen[s] = 0, new_times, now
                slots = np.concatenate([ks, s])
        if moved:
            slots = self.find(uniq)
            slots = slots[slots >= 0]
        eligible = slots[(self.row[slots] == 0) & (self.count[slots] >= admit_after)]
        if not len(eligible):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        eligible = eligible[np.lexsort((self.keys[eligible], -self.count[eligible]))]
        admit = self.keys[eligible]
        rows = self._free_rows(len(admit))
        if len(rows) < len(admit):
            self._evict(len(admit) - len(rows), uniq, now, eviction, half_life)
            rows = self._free_rows(len(admit))
            eligible = self.find(admit)  # found again: the eviction may have rehashed the slots
        admit = admit[: len(rows)]
        self.row[eligible[: len(rows)]] = rows
        self.held[rows] = True
        if len(rows):
            self.hint[0] = rows[-1] + 1
        return rows.astype(np.int64), admit

    def _free_rows(self, n: int) -> np.ndarray:
        """The ``n`` lowest rows without an id (all of them where fewer), read from the hint on in growing blocks
        rather than over the whole table each time."""
        found, got, pos, step = [], 0, int(self.hint[0]), max(4096, 2 * n)
        while got < n and pos < len(self.held):
            part = np.flatnonzero(~self.held[pos : pos + step])[: n - got] + pos
            found.append(part)
            got, pos, step = got + len(part), pos + step, 2 * step
        return np.concatenate(found) if found else np.empty(0, np.int64)

    def _forget_candidates(self, wanted: int, batch: np.ndarray, now: int, half_life: int) -> int:
        """Forgets up to ``wanted`` candidates not in ``batch``: the lowest decayed counts, then the smaller ids."""
        cand = np.flatnonzero((self.state == USED) & (self.row == 0))
        cand = cand[~np.isin(self.keys[cand], batch)]
        if not len(cand):
            return 0
        wanted = max(wanted, -(-self.max_entries // BATCHED))
        order = np.lexsort((self.keys[cand], self.decayed(cand, now, half_life)))[:wanted]
        self._remove(cand[order])
        return len(order)

    def _evict(self, wanted: int, batch: np.ndarray, now: int, eviction: str, half_life: int) -> None:
        """Evicts up to ``wanted`` admitted ids not in ``batch``, freeing their rows."""
        held = np.flatnonzero((self.state == USED) & (self.row > 0))
        held = held[~np.isin(self.keys[held], batch)]
        if not len(held):
            return
        score = self.decayed(held, now, half_life) if eviction == "lfu" else self.seen[held].astype(np.float64)
        wanted = max(wanted, -(-self.capacity // BATCHED))
        order = np.lexsort((self.keys[held], score))[:wanted]
        victims = held[order]
        self.held[self.row[victims]] = False
        self.hint[0] = min(int(self.hint[0]), int(self.row[victims].min()))
        self._remove(victims)

    def preadmit(self, ids: np.ndarray, admit_after: float) -> None:
        """An empty map's first ids, as a vocabulary would give them: the ids of ``ids`` seen at least
        ``admit_after`` times, most often seen first (ties: the smaller id), in rows 1, 2, ... while the table has
        rows, each with its count (as batch 0's)."""
        uniq, times = np.unique(ids, return_counts=True)
        keep = np.flatnonzero(times >= admit_after)
        keep = keep[np.lexsort((uniq[keep], -times[keep]))][: self.capacity - 1]
        if len(keep):
            s = self._insert(uniq[keep])
            placed = s >= 0
            rows = np.arange(1, int(placed.sum()) + 1)
            self.row[s[placed]], self.count[s[placed]], self.seen[s[placed]] = rows, times[keep][placed], 0
            self.held[rows] = True

    def admitted(self) -> dict[int, int]:
        """id -> row of every admitted id (for tests and inspection)."""
        s = np.flatnonzero((self.state == USED) & (self.row > 0))
        return dict(zip(self.keys[s].tolist(), self.row[s].tolist()))


class DynamicIds(nn.Module):
    """Translates the dynamic columns of a (B, F) id batch from raw ids to rows (see the module's docstring).

    Args:
        columns: the categorical columns (one-hot features, in channel order) that hold raw ids.
        capacities: rows of each of those features' tables (its cardinality; row 0 the rare row).
        max_entries: ids each map holds, admitted or not (default twice the capacity).
    """

    def __init__(self, columns: Sequence[int], capacities: Sequence[int], max_entries: Sequence[int] | None = None):
        super().__init__()
        if len(columns) != len(capacities) or any(int(c) < 2 for c in capacities):
            raise ValueError(f"each dynamic feature needs a capacity of at least 2 rows, got {list(capacities)}")
        for c in capacities:
            check_capacity(int(c), "a dynamic feature's capacity (its cardinality in the feature spec)")
        self.columns = tuple(int(c) for c in columns)
        self.capacities = tuple(int(c) for c in capacities)
        self.max_entries = tuple(int(m) for m in (max_entries or [2 * c for c in self.capacities]))
        self.admit_after: float = ADMIT_AFTER
        self.eviction = "lfu"
        self.half_life = HALF_LIFE
        self.register_buffer("batches", torch.zeros((), dtype=torch.int64))  # batches observed
        self.register_buffer("hash_key", new_key())  # the maps' secret hash key (``keyed_mix``)
        self._free_hints = np.zeros(len(self.columns), np.int64)  # IdMap.hint of each feature (not state)
        for j, (cap, most) in enumerate(zip(self.capacities, self.max_entries)):
            n = slots_for(most)
            self.register_buffer(f"keys{j}", torch.zeros(n, dtype=torch.int64))
            self.register_buffer(f"state{j}", torch.zeros(n, dtype=torch.int8))
            self.register_buffer(f"row{j}", torch.zeros(n, dtype=torch.int32))
            self.register_buffer(f"count{j}", torch.zeros(n, dtype=torch.float64))
            self.register_buffer(f"seen{j}", torch.zeros(n, dtype=torch.int64))
            held = torch.zeros(cap, dtype=torch.bool)
            held[0] = True  # the rare row
            self.register_buffer(f"held{j}", held)
            self.register_buffer(f"sizes{j}", torch.zeros(2, dtype=torch.int64))

    def configure(self, admit_after: float = ADMIT_AFTER, eviction: str = "lfu", half_life: int = HALF_LIFE) -> None:
        """Training's settings: sightings before admission, which ids are evicted first, the counts' half-life."""
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {', '.join(EVICTIONS)}, got {eviction!r}")
        if admit_after < 1 or half_life < 0:
            raise ValueError(f"admit_after must be >= 1 and half_life >= 0, got {admit_after} and {half_life}")
        self.admit_after, self.eviction, self.half_life = float(admit_after), eviction, int(half_life)

    def _apply(self, fn, recurse=True):
        return self  # the maps stay in host memory whatever device or dtype the model moves to

    def map(self, j: int) -> IdMap:
        """Feature ``j``'s map, over this module's buffers (shared, not copied)."""
        arrays = [getattr(self, f"{k}{j}").numpy() for k in ("keys", "state", "row", "count", "seen", "held", "sizes")]
        return IdMap(*arrays, capacity=self.capacities[j], max_entries=self.max_entries[j],
                     hint=self._free_hints[j : j + 1], key=self.hash_key.numpy())  # fmt: skip

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if prefix + "hash_key" not in state_dict:  # written before the maps were keyed: the unkeyed mixer
            state_dict[prefix + "hash_key"] = torch.zeros(2, dtype=torch.int64)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._free_hints[:] = 0  # other maps: their free rows searched from the start

    def share_key(self) -> None:
        """Every rank of a job takes rank 0's hash key (their maps must agree slot for slot); one process: nothing."""
        import torch.distributed as dist

        device = _collective_device()
        if device is None:
            return
        key = self.hash_key.to(device)
        dist.broadcast(key, src=0)
        self.hash_key.copy_(key.cpu())

    @torch._disable_dynamo  # torch.compile compiles around it; torch._dynamo imported only when it is called
    def forward(self, categorical: torch.Tensor) -> torch.Tensor:
        """(B, F) ids with the dynamic columns' raw ids replaced by their rows."""
        out = categorical.clone()
        host = categorical.detach().cpu() if categorical.device.type != "cpu" else categorical
        for j, c in enumerate(self.columns):
            rows = self.map(j).rows(host[:, c].numpy())
            out[:, c] = torch.from_numpy(rows).to(out.device)
        return out

    @torch.no_grad()
    def observe(self, categorical: torch.Tensor) -> dict[int, np.ndarray]:
        """Counts a training batch's raw ids, admits and evicts (see the module's docstring); returns, per column,
        the rows newly given to an id (their weights and optimizer state are to be reset: ``reset_table_rows``).
        In a hybrid-parallel job each rank counts the whole batch (every rank's part, gathered), so every rank's
        maps stay the same and equal the single process's."""
        host = _whole_batch(categorical.detach()[:, list(self.columns)])
        now = int(self.batches)
        fresh = {}
        for j, c in enumerate(self.columns):
            rows, _ = self.map(j).observe(host[:, j].numpy(), now, self.admit_after, self.eviction, self.half_life)
            if len(rows):
                fresh[c] = rows
        self.batches += 1
        return fresh

    @torch.no_grad()
    def preadmit(self, categorical: torch.Tensor) -> bool:
        """Before training's first batch, while every map is empty: each dynamic column's ids of these rows (the warm
        start's) admitted as a vocabulary admits them (``IdMap.preadmit``), so that the warm start's regression
        fits their rows. Returns whether it admitted (False: a map already holds ids, as a continued run's)."""
        if any(int(getattr(self, f"sizes{j}")[0]) for j in range(len(self.columns))):
            return False
        host = categorical.detach().cpu()
        for j, c in enumerate(self.columns):
            self.map(j).preadmit(host[:, c].numpy(), self.admit_after)
        return True

    def rows_in_use(self) -> list[int]:
        """Rows held by an id in each dynamic feature's table (the rare row included)."""
        return [int(getattr(self, f"held{j}").sum()) for j in range(len(self.columns))]


def _collective_device() -> torch.device | None:
    """Where this job's collectives take tensors: CUDA under NCCL, the CPU under gloo; None in one process
    (``models/`` leaves ``distributed/`` alone: inline)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _whole_batch(ids: torch.Tensor) -> torch.Tensor:
    """(B_r, k) ids of this rank's samples -> (B, k) on the CPU: every rank's, in rank order (one process: as
    given)."""
    import torch.distributed as dist

    device = _collective_device()
    if device is None:
        return ids.cpu()
    n = torch.tensor([ids.shape[0]], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, n)
    most = int(max(int(s) for s in sizes))
    padded = torch.zeros(most, ids.shape[1], dtype=torch.int64, device=device)
    padded[: ids.shape[0]] = ids
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(s)].cpu() for p, s in zip(parts, sizes)])


def dynamic_ids(config) -> DynamicIds | None:
    """The model's DynamicIds for a config's ``dynamic_features`` (None without)."""
    columns = tuple(getattr(config, "dynamic_features", ()) or ())
    if not columns:
        return None
    return DynamicIds(columns, [config.cardinalities[c] for c in columns])


DYNAMIC_FILE = "dynamic_ids.npz"  # an export's id -> row maps, beside its model file


def frozen_arrays(ids: DynamicIds) -> dict[str, np.ndarray]:
    """The admitted ids and their rows of every dynamic column, sorted by id: what an export serves with."""
    out = {"columns": np.array(ids.columns, np.int64)}
    for j in range(len(ids.columns)):
        m = ids.map(j)
        s = np.flatnonzero((m.state == USED) & (m.row > 0))
        order = np.argsort(m.keys[s], kind="stable")
        out[f"keys{j}"], out[f"rows{j}"] = m.keys[s][order], m.row[s][order].astype(np.int64)
    return out


def lookup_sorted(keys: np.ndarray, values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``values[i]`` for each of ``ids`` equal to ``keys[i]`` (``keys`` sorted, distinct), 0 for any other id."""
    if not len(keys):
        return np.zeros(len(ids), np.int64)
    at = np.minimum(np.searchsorted(keys, ids), len(keys) - 1)
    return np.where(keys[at] == ids, values[at], 0)


class FrozenIds:
    """Serving's id -> row translation from ``frozen_arrays``: admitted ids to their rows, any other id to row 0
    (no counting, no admission: the served model is the one exported)."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.columns = [int(c) for c in arrays["columns"]]
        self.keys = [np.asarray(arrays[f"keys{j}"]) for j in range(len(self.columns))]
        self.rows = [np.asarray(arrays[f"rows{j}"]) for j in range(len(self.columns))]

    def __call__(self, categorical: np.ndarray) -> np.ndarray:
        out = np.array(categorical, dtype=np.int64, copy=True)
        for c, keys, rows in zip(self.columns, self.keys, self.rows):
            out[:, c] = lookup_sorted(keys, rows, out[:, c])
        return out
