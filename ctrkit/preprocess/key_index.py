"""Dense codes for int64 keys, held in a growing open-addressing hash table built from numpy operations.

The Polars engine gives every distinct categorical key of a column a *code* (0, 1, 2, ... in order
of first appearance, new keys of one call ordered by value) while it reads, so it can count with
``np.bincount`` and write 4-byte codes; once the vocabulary is known, ids are one gather
``id_of_code[codes]``. Numpy's vectorised probing does this several times faster than a hash join
per block, and it releases the GIL, so columns can be coded on several threads.

Linear probing, load factor at most 1/2, Fibonacci hashing of the key. Any int64 is a key except
``RESERVED`` (1), which marks an empty slot: no ``vocabulary.key_expr`` key is 1 (a value of zero
digits is the empty one, key 0).
"""

from __future__ import annotations

import numpy as np

RESERVED = 1
_WINDOW = 8  # slots a probe looks at per step: clusters are short at load <= 1/2
_STEPS = np.arange(_WINDOW)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: spreads consecutive keys over the table


class KeyIndex:
    """Codes of the keys of one column.

    Example:
        >>> index = KeyIndex()
        >>> index.codes(np.array([7, 3, 7]))
        array([1, 0, 1], dtype=uint32)
        >>> index.keys
        array([3, 7])
    """

    def __init__(self, capacity_bits: int = 10):
        self._size = 0
        self._keys = np.empty(1 << (capacity_bits - 1), dtype=np.int64)  # key of each code
        self._allocate(capacity_bits)

    def __len__(self) -> int:
        return self._size

    @property
    def keys(self) -> np.ndarray:
        """Key of each code, (len(self),) int64."""
        return self._keys[: self._size]

    def codes(self, keys: np.ndarray) -> np.ndarray:
        """Codes of ``keys`` (n,) int64, as (n,) uint32; keys not seen before get new codes."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if (keys == RESERVED).any():
            raise ValueError(f"{RESERVED} is reserved and cannot be a key")
        codes = self._find(keys)
        missing = np.flatnonzero(codes < 0)
        if len(missing):
            new = np.unique(keys[missing])
            self._add(new)
            codes[missing] = self._find(keys[missing])
        return codes.view(np.uint32)  # all >= 0 now

    def _allocate(self, bits: int) -> None:
        self._bits = bits
        self._mask = (1 << bits) - 1
        self._slot_keys = np.full(1 << bits, RESERVED, dtype=np.int64)
        self._slot_codes = np.zeros(1 << bits, dtype=np.int32)  # 2**31 codes per column is plenty

    def _home(self, keys: np.ndarray) -> np.ndarray:
        """The slot each key's probe starts at: the top ``bits`` bits of key * golden (mod 2**64)."""
        slots = np.multiply(keys.view(np.uint64), _GOLDEN)
        np.right_shift(slots, np.uint64(64 - self._bits), out=slots)
        return slots.view(np.int64)  # < 2**bits, so the same numbers

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """Codes of ``keys``, -1 for keys not in the table."""
        slots = self._home(keys)
        held = self._slot_keys.take(slots)
        codes = self._slot_codes.take(slots)  # right where the key sits in its home slot: most keys
        away = held != keys
        if not away.any():
            return codes
        rows = np.flatnonzero(away)
        codes[rows] = -1
        keys, slots = keys[rows], slots[rows]
        while len(rows):  # the rest probe on, _WINDOW slots at a time
            window = (slots[:, None] + _STEPS) & self._mask  # (m, W)
            held = self._slot_keys.take(window)
            hit = held == keys[:, None]
            stop = hit | (held == RESERVED)  # the key, or an empty slot: it is not in the table
            first = stop.argmax(axis=1)
            at = np.arange(len(rows))
            found = hit[at, first]
            codes[rows[found]] = self._slot_codes.take(window[at, first][found])
            go_on = ~stop[at, first]
            rows, keys, slots = rows[go_on], keys[go_on], (slots[go_on] + _WINDOW) & self._mask
        return codes

    def _add(self, new: np.ndarray) -> None:
        """Gives the distinct keys ``new`` (none in the table yet) the next codes, in the order given."""
        size = self._size + len(new)
        if 2 * size > len(self._slot_keys):
            bits = max(self._bits + 1, int(2 * size - 1).bit_length())
            self._allocate(bits)
            self._insert(self._keys[: self._size], np.arange(self._size, dtype=np.int32))
        if size > len(self._keys):
            self._keys = np.concatenate([self._keys[: self._size], np.empty(size, dtype=np.int64)])
        self._keys[self._size : size] = new
        self._insert(new, np.arange(self._size, size, dtype=np.int32))
        self._size = size

    def _insert(self, keys: np.ndarray, codes: np.ndarray) -> None:
        slots = self._home(keys)
        while len(keys):
            free = self._slot_keys[slots] == RESERVED
            self._slot_keys[slots[free]] = keys[free]  # keys racing for one free slot: the last write wins it
            won = np.zeros(len(keys), dtype=bool)
            won[free] = self._slot_keys[slots[free]] == keys[free]
            self._slot_codes[slots[won]] = codes[won]
            lost = ~won
            keys, codes, slots = keys[lost], codes[lost], (slots[lost] + 1) & self._mask
