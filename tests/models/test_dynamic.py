"""Dynamic tables (models/dynamic.py): the id map against a plain reference written here, and the rows' reset."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ctrkit.models.dynamic import BATCHED, DynamicIds, mix64
from ctrkit.models.registry import create_model, make_config
from ctrkit.train.dynamic_rows import reset_table_rows
from ctrkit.train.optim import SparseRowOptimizer


class Reference:
    """The rules of models/dynamic.py with dicts and sorted lists: counts decayed per batch, admission at
    ``admit_after`` (highest count first, then smaller id), eviction of the lowest score not in the batch
    (then smaller id), at least capacity / BATCHED rows at a time; candidates bounded by ``max_entries``."""

    def __init__(self, capacity, max_entries, admit_after, eviction, half_life):
        self.capacity, self.max_entries = capacity, max_entries
        self.admit_after, self.eviction, self.half_life = admit_after, eviction, half_life
        self.entries = {}  # id -> [row, count, seen]
        self.now = 0

    def decayed(self, e):
        return e[1] if self.half_life <= 0 else e[1] * 2.0 ** (-(self.now - e[2]) / self.half_life)

    def observe(self, ids):
        batch = {}
        for i in ids.tolist():
            batch[i] = batch.get(i, 0) + 1
        new = []
        for i, k in sorted(batch.items()):
            if i in self.entries:
                e = self.entries[i]
                e[1], e[2] = self.decayed(e) + k, self.now
            else:
                new.append((i, k))
        room = self.max_entries - len(self.entries)
        if room < len(new):
            cands = sorted((self.decayed(e), i) for i, e in self.entries.items() if e[0] == 0 and i not in batch)[
                : max(len(new) - room, math.ceil(self.max_entries / BATCHED))
            ]
            for _, i in cands:
                del self.entries[i]
            room += len(cands)
        new = sorted(new, key=lambda x: (-x[1], x[0]))[: max(room, 0)]
        for i, k in new:
            self.entries[i] = [0, float(k), self.now]
        eligible = sorted(
            (-e[1], i) for i, e in self.entries.items() if i in batch and e[0] == 0 and e[1] >= self.admit_after
        )
        held = {e[0] for e in self.entries.values() if e[0] > 0}
        free = [r for r in range(1, self.capacity) if r not in held]
        if len(free) < len(eligible):
            score = (lambda e: self.decayed(e)) if self.eviction == "lfu" else (lambda e: e[2])
            victims = sorted((score(e), i) for i, e in self.entries.items() if e[0] > 0 and i not in batch)
            for _, i in victims[: max(len(eligible) - len(free), math.ceil(self.capacity / BATCHED))]:
                del self.entries[i]
            held = {e[0] for e in self.entries.values() if e[0] > 0}
            free = [r for r in range(1, self.capacity) if r not in held]
        given = []
        for (_, i), r in zip(eligible, free):
            self.entries[i][0] = r
            given.append(r)
        self.now += 1
        return given

    def rows(self, ids):
        return [self.entries[i][0] if i in self.entries else 0 for i in ids.tolist()]

    def admitted(self):
        return {i: e[0] for i, e in self.entries.items() if e[0] > 0}


def stream(seed, batches, batch, vocab):
    """Batches of power-law ids whose popular ids change over time (drawn over a window that moves), as 64-bit
    values anywhere in the int64 range."""
    g = np.random.default_rng(seed)
    names = g.integers(-(2**63), 2**63 - 1, size=vocab * 3, dtype=np.int64)
    for b in range(batches):
        start = b * vocab // batches
        ranks = np.minimum(g.zipf(1.3, size=batch) - 1, vocab - 1)
        yield names[start + ranks]


@pytest.mark.parametrize(
    "capacity,max_entries,admit_after,eviction,half_life",
    [(40, 80, 1, "lfu", 0), (40, 70, 2, "lfu", 5), (30, 60, 3, "lru", 0), (200, 400, 2, "lfu", 20)],
)
def test_map_follows_the_reference(capacity, max_entries, admit_after, eviction, half_life):
    ids = DynamicIds([0], [capacity], [max_entries])
    ids.configure(admit_after, eviction, half_life)
    ref = Reference(capacity, max_entries, admit_after, eviction, half_life)
    evicted_seen = admitted_late = False
    for batch in stream(1, 60, 64, 500):
        before = ref.admitted()
        fresh = ids.observe(torch.from_numpy(batch).view(-1, 1))
        given = ref.observe(batch)
        assert sorted(fresh.get(0, np.empty(0)).tolist()) == sorted(given)
        m = ids.map(0)
        assert m.admitted() == ref.admitted()
        probe = np.concatenate([batch, np.array([12345, -7], np.int64)])
        assert ids(torch.from_numpy(probe).view(-1, 1))[:, 0].tolist() == ref.rows(probe)
        assert int(m.sizes[0]) == len(ref.entries) <= max_entries
        assert ids.rows_in_use()[0] <= capacity
        evicted_seen |= bool(set(before) - set(ref.admitted()))
        admitted_late |= any(ref.entries[i][1] > 1 for i in ref.admitted() if i not in before)
    assert evicted_seen  # the stream filled the table: eviction ran
    if admit_after > 1:
        assert admitted_late


def test_free_rows_of_a_large_table_follow_the_reference():
    """More rows than one block of the free-row search, filled, then rows freed low in the table and taken again."""
    capacity = 9000
    ids = DynamicIds([0], [capacity], [2 * capacity])
    ref = Reference(capacity, 2 * capacity, 1, "lfu", 0)
    for b in range(12):  # 1,000 new ids a batch, each id of the first batches seen less often
        batch = np.repeat(np.arange(b * 1000, (b + 1) * 1000, dtype=np.int64), 1 + b // 4)
        fresh = ids.observe(torch.from_numpy(batch).view(-1, 1))
        assert sorted(fresh.get(0, np.empty(0)).tolist()) == sorted(ref.observe(batch))
    assert ids.map(0).admitted() == ref.admitted() and max(ref.admitted().values()) > 4096
    assert ids.map(0).hint[0] > 0


def test_map_survives_deletions_and_rehash():
    ids = DynamicIds([0], [8], [16])
    m = ids.map(0)
    slots = len(m.keys)
    for start in range(0, 4000, 4):  # every batch new ids: candidates forgotten over and over
        ids.observe(torch.arange(start, start + 4).view(-1, 1))
        assert int((m.state == 1).sum()) == int(m.sizes[0]) <= 16
        assert int(m.sizes[1]) <= 0.75 * slots + 4
    last = torch.arange(3996, 4000).view(-1, 1)
    assert (ids(last) > 0).all()  # the last batch's ids were admitted (admit_after 1)


def test_mix64_is_a_bijection_on_a_sample():
    x = np.arange(-5000, 5000, dtype=np.int64)
    assert len(np.unique(mix64(x))) == len(x)


def test_scoring_reads_without_counting():
    ids = DynamicIds([1], [10])
    batch = torch.tensor([[3, 111], [4, 222], [5, 111]])
    ids.eval()
    assert ids(batch).tolist() == [[3, 0], [4, 0], [5, 0]]  # nothing admitted: the rare row; column 0 untouched
    assert int(ids.batches) == 0 and int(ids.map(0).sizes[0]) == 0
    ids.observe(batch)
    rows = ids(batch)[:, 1].tolist()
    assert rows[0] == rows[2] and rows[0] != rows[1] and min(rows) >= 1


def test_checkpoint_state_round_trip():
    ids = DynamicIds([0], [20])
    for batch in stream(3, 10, 32, 100):
        ids.observe(torch.from_numpy(batch).view(-1, 1))
    copy = DynamicIds([0], [20])
    for batch in stream(5, 10, 32, 100):  # its own history first: its search for free rows starts elsewhere
        copy.observe(torch.from_numpy(batch).view(-1, 1))
    copy.load_state_dict(ids.state_dict())
    assert copy.map(0).admitted() == ids.map(0).admitted() and int(copy.batches) == 10
    nxt = torch.from_numpy(next(stream(4, 1, 32, 100))).view(-1, 1)
    assert {k: v.tolist() for k, v in copy.observe(nxt).items()} == {k: v.tolist() for k, v in ids.observe(nxt).items()}


@pytest.mark.parametrize("kind", ["adam", "adagrad", "rowwise_adagrad", "ftrl"])
def test_admitted_rows_start_from_the_rare_row_with_fresh_state(kind):
    config = make_config("dlrm", {"num_numerical": 2, "cardinalities": (6, 9), "embedding_dim": 4,
                                  "bottom_mlp": (8, 4), "top_mlp": (8, 1), "dynamic_features": (1,)})  # fmt: skip
    model = create_model("dlrm", config)
    table = model.embeddings.onehot.weight
    wide = model.wide_embeddings.onehot.weight
    opt = SparseRowOptimizer([table, wide], kind, 0.1)
    num = torch.randn(4, 2)
    cat = torch.tensor([[1, 10**12], [2, 10**12], [3, -5], [4, -5]])
    for _ in range(3):  # state for every row the rare row and column 0 touched
        opt.zero_grad()
        model(num, cat).sum().backward()
        opt.step()
    state_before = {k: v.clone() for k, v in opt.state[table].items() if torch.is_tensor(v) and v.dim()}
    fresh = model.dynamic_ids.observe(cat)
    assert sorted(fresh[1].tolist()) == [1, 2]
    reset_table_rows(model, [opt], fresh)
    base = model.embeddings.onehot.offsets[1].item()  # the rare row of column 1
    for r in (1, 2):
        assert torch.equal(table[base + r], table[base])
        assert torch.equal(wide[6 + r], wide[6])
        for k, v in opt.state[table].items():
            if torch.is_tensor(v) and v.dim():
                expected = 0.1 if k == "accumulator" else 0.0
                assert torch.all(v[base + r] == expected), k
    for k, v in state_before.items():  # the other rows keep theirs
        assert torch.equal(opt.state[table][k][: base + 1], v[: base + 1])
    rows = model.dynamic_ids(cat)[:, 1]
    assert rows.tolist()[0] == rows.tolist()[1] != rows.tolist()[2]


def test_preadmit_gives_an_empty_map_a_vocabulary():
    ids = DynamicIds([0], [4])
    ids.configure(admit_after=2)
    column = torch.tensor([7, 7, 7, 9, 9, 5, 5, 3, 3, 8]).view(-1, 1)  # 8 seen once: not admitted
    assert ids.preadmit(column)
    assert ids.map(0).admitted() == {7: 1, 3: 2, 5: 3}  # most often first, ties by the smaller id; 3 rows free
    assert ids(torch.tensor([[9], [8], [7]])).view(-1).tolist() == [0, 0, 1]
    assert not ids.preadmit(column)  # a map that holds ids (a continued run's) is left as it is
    fresh = ids.observe(torch.tensor([[9], [9], [8]]))  # 9 seen twice: admitted, evicting a lowest count (3 or 5:
    assert fresh[0].tolist() == [2] and ids.map(0).admitted() == {7: 1, 9: 2, 5: 3}  # the smaller id goes)


def unmix64(z: np.ndarray) -> np.ndarray:
    """The inverse of SplitMix64's finaliser (``mix64``): what an attacker computes to aim ids at chosen slots."""

    def unshift(v: np.ndarray, s: int) -> np.ndarray:
        x = v.copy()
        for _ in range(64 // s + 1):
            x = v ^ (x >> np.uint64(s))
        return x

    z = z.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = unshift(z, 31) * np.uint64(pow(0x94D049BB133111EB, -1, 2**64))
        z = unshift(z, 27) * np.uint64(pow(0xBF58476D1CE4E5B9, -1, 2**64))
    return unshift(z, 30).view(np.int64)


def crafted_ids(n: int = 20_000, bits: int = 20) -> np.ndarray:
    """``n`` ids whose unkeyed hash shares its low ``bits`` bits: under the old map, one slot and one probe chain."""
    ids = unmix64((np.arange(1, n + 1, dtype=np.uint64) << np.uint64(bits)) | np.uint64(0xABCDE))
    assert len(np.unique(mix64(ids) & np.uint64(2**bits - 1))) == 1
    return ids


def test_ids_crafted_against_the_unkeyed_mixer_spread_under_the_models_key():
    """20,000 ids aimed at one slot of the unkeyed mixer: in a model's map (keyed) they sit as close to their first
    slots as random ids do, and every one is admitted; the key differs between models and survives a state dict."""
    crafted = crafted_ids()
    rng = np.random.default_rng(0)
    random_ids = rng.integers(-(2**62), 2**62, len(crafted))
    lengths = {}
    for name, ids in (("crafted", crafted), ("random", random_ids)):
        dyn = DynamicIds([0], [30_000])
        dyn.observe(torch.from_numpy(ids).view(-1, 1))
        m = dyn.map(0)
        admitted = m.admitted()
        assert len(admitted) == len(ids)  # each has its row
        lengths[name] = m.probe_lengths()
        assert np.array_equal(m.rows(ids), np.array([admitted[int(i)] for i in ids]))
    assert lengths["crafted"].mean() < 1.5 * lengths["random"].mean() + 0.1
    assert lengths["crafted"].max() < 40
    a, b = DynamicIds([0], [8]), DynamicIds([0], [8])
    assert not torch.equal(a.hash_key, b.hash_key) and int(a.hash_key.abs().min()) > 0
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.hash_key, b.hash_key)


def test_probing_is_bounded_whatever_the_ids():
    """Under the unkeyed mixer (a map written before keys), the crafted ids share one first slot: no lookup or insert
    looks past MAX_PROBE slots; the ids beyond them stay unknown (the rare row) rather than lengthen every lookup. A
    state dict without a key loads as such a map, and finds its ids."""
    from ctrkit.models.dynamic import MAX_PROBE

    crafted = crafted_ids()
    dyn = DynamicIds([0], [30_000])
    state = dyn.state_dict()
    del state["hash_key"]  # as written before keys existed
    dyn.load_state_dict(state)
    assert int(dyn.hash_key.abs().sum()) == 0
    dyn.observe(torch.from_numpy(crafted).view(-1, 1))
    m = dyn.map(0)
    assert len(m.admitted()) == MAX_PROBE and m.probe_lengths().max() == MAX_PROBE - 1
    rows = m.rows(crafted)
    assert (rows > 0).sum() == MAX_PROBE and set(rows[rows > 0].tolist()) == set(m.admitted().values())
    copy = DynamicIds([0], [30_000])
    state = dyn.state_dict()
    del state["hash_key"]
    copy.load_state_dict(state)
    assert np.array_equal(copy.map(0).rows(crafted), rows)
