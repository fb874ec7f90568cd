"""Value -> id, the one owner: every id a dataset holds and every id a scorer computes comes from this module.

* The id rule (``assign_ids``): values seen at least ``frequency_threshold`` times get ids by descending count, the
  rest share the rare id; a later day's extension of a model's vocabulary (``extend``). Criteo's keys and a table's
  text values alike.
* Criteo's value keys (``key_expr``), its vocabulary's Parquet form, and a key's id (``ids_of_keys``).
* Looking a value up in a vocabulary: a text value (``ValueIndex``, what ``preprocess table`` writes and every scorer
  applies), a raw 64-bit id (``xxh64_ids``, ``hex_key_ids``), and the Outbrain recipe's ids, positions in a sorted
  vocabulary (``sorted_ids``, ``positions``, ``locate``, ``lookup``, ``codes``).

A category is a hexadecimal number written with a given number of digits, so ``"0a"`` and ``"a"`` are
different values while ``"A1"`` and ``"a1"`` are the same one. Every value is held as one int64
*key*, ``int(value, 16) + (len(value) << 60)`` modulo 2**64 (values of 8 or more digits have the top
bit set, so their int64 keys are negative): exact and injective for up to 15 digits, and read as
unsigned its order is the recipe's tie-break order (fewer digits first, then the number, i.e. plain
string order for Criteo's fixed-width lowercase hashes). The empty (missing) value has key 0. Both engines
count keys and build ids with the functions here, which is what makes their outputs identical (the Spark engines
join the tables built here).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ctrkit.preprocess.criteo import FIRST_ID, MISSING_ID, RARE_ID

MAX_DIGITS = 15
LENGTH_SHIFT = 60
MISSING_KEY = 0
NULL = np.iinfo(np.int64).min  # a missing value in the Outbrain recipe's int64 id columns (raw ids are not this)
_HASH_SEEDS = (0x5EED, 0xC0FFEE)  # Polars' hashes of a value, only ever compared within one process (``ValueIndex``)
# values looked up at once from which a vocabulary is joined (Polars' hash join builds a table of the vocabulary each
# time) rather than searched by hash pairs: at least JOIN_MIN and JOIN_RATIO x the vocabulary's values
JOIN_MIN, JOIN_RATIO = 8192, 2


def key_expr(column: str) -> pl.Expr:
    """Key of each value of the string ``column``; null where the value is not a valid category.

    Valid: empty (missing, key 0) or 1 to 15 hexadecimal digits without a sign.
    """
    return key_of(pl.col(column))


def key_of(value: pl.Expr) -> pl.Expr:
    """``key_expr`` of the string values ``value``."""
    length = value.str.len_bytes().cast(pl.Int64)
    number = value.str.to_integer(base=16, strict=False)
    signed = value.str.starts_with("+") | value.str.starts_with("-")
    valid = (length == 0) | (number.is_not_null() & ~signed & (length <= MAX_DIGITS))
    return (
        pl.when(length == 0).then(MISSING_KEY).when(valid).then(number + length * (1 << LENGTH_SHIFT)).otherwise(None)
    )


def key_strings(keys: np.ndarray) -> pl.Series:
    """The lowercase value strings of ``keys`` (inverse of ``key_expr`` up to case)."""
    keys = np.asarray(keys, dtype=np.int64).view(np.uint64)  # 8+ digit keys are negative as int64
    lengths = (keys >> np.uint64(LENGTH_SHIFT)).astype(np.int64)
    numbers = (keys & np.uint64((1 << LENGTH_SHIFT) - 1)).astype(np.int64)
    digits = np.zeros((len(keys), MAX_DIGITS), dtype=np.uint8)
    for i in range(MAX_DIGITS):  # digit i from the left of a value with `lengths` digits
        shift = 4 * (lengths - 1 - i)
        nibble = (numbers >> np.maximum(shift, 0)) & 15
        digits[:, i] = np.where(shift >= 0, np.frombuffer(b"0123456789abcdef", np.uint8)[nibble], 0)
    return pl.Series("value", digits.view(f"S{MAX_DIGITS}").ravel()).cast(pl.String)


def vocabulary(counts: pl.DataFrame, frequency_threshold: int) -> pl.DataFrame:
    """(value, count, id) from the train split's (key, count) pairs of one column, ids as the recipe says.

    Values seen at least ``frequency_threshold`` times get ids from FIRST_ID by descending count, ties
    by key (unsigned); the rest share RARE_ID (listed by key). The missing value is left out (it is MISSING_ID).
    """
    # keys of 8 or more digits pass 2**63: as int64 they wrap to negative numbers, as uint64 they keep the order
    counts = counts.filter(pl.col("key") != MISSING_KEY).with_columns(
        pl.col("key").reinterpret(signed=False).alias("_order")
    )
    vocab = assign_ids(counts, frequency_threshold, "_order").select("key", "count", "id")
    return vocab.with_columns(key_strings(vocab["key"].to_numpy()), pl.col("count").cast(pl.Int64))


def assign_ids(counts: pl.DataFrame, frequency_threshold: int, order: str) -> pl.DataFrame:
    """``counts`` (a ``count`` column and an ``order`` column) with an int64 ``id``: rows counted at least
    ``frequency_threshold`` times get FIRST_ID.. by descending count, ties by ``order``; the others, listed
    after them by ``order``, share RARE_ID. The recipes' one id rule (Criteo's keys, a table's text values)."""
    frequent = (
        counts.filter(pl.col("count") >= frequency_threshold)
        .sort(["count", order], descending=[True, False])
        .with_row_index("id", offset=FIRST_ID)
        .with_columns(pl.col("id").cast(pl.Int64))
    )
    rare = (
        counts.filter(pl.col("count") < frequency_threshold)
        .sort(order)
        .with_columns(pl.lit(RARE_ID, pl.Int64).alias("id"))
    )
    return pl.concat([frequent, rare.select(frequent.columns)])


def extend(old: pl.DataFrame, fresh: pl.DataFrame, threshold: int) -> pl.DataFrame:
    """A model's vocabulary ``old`` (value, id) extended by ``fresh`` (value, count, id: the new day's fitting rows),
    as (value, count, id): each value with a row of its own keeps its id (its learned row keeps its meaning); a
    value without one (new, or rare so far: it shared the rare row) gets the next id after the model's last, by
    descending count (ties by value), where seen at least ``threshold`` times, else the shared rare id. What a later
    day written ``--like`` a model holds, a table's or Criteo's."""
    counts = fresh.select("value", "count")
    own = old.filter(pl.col("id") >= FIRST_ID)
    kept = own.join(counts, on="value", how="left", maintain_order="left").with_columns(
        pl.col("count").fill_null(0).cast(pl.Int64)
    )
    candidates = counts.join(own.select("value"), on="value", how="anti")
    grown = assign_ids(candidates, threshold, "value")
    first = cardinality(old)  # the next row after the model's last
    grown = grown.with_columns(pl.when(pl.col("id") >= FIRST_ID).then(pl.col("id") - FIRST_ID + first)
                               .otherwise(pl.col("id")).alias("id"))  # fmt: skip
    still_rare = old.filter(pl.col("id") < FIRST_ID).join(candidates.select("value"), on="value", how="anti")
    still_rare = still_rare.with_columns(pl.lit(0, pl.Int64).alias("count"))
    return pl.concat([kept.select("value", "count", "id"), grown.select("value", "count", "id"),
                      still_rare.select("value", "count", "id")])  # fmt: skip


def extend_keyed(old: pl.DataFrame, fresh: pl.DataFrame, threshold: int) -> pl.DataFrame:
    """``extend`` of a Criteo vocabulary, in ``vocabulary``'s form (key, count, id, value): what both Criteo engines
    write for a day ``--like`` a model."""
    grown = extend(old, fresh, threshold).with_columns(pl.col("value").alias("_v"))
    return grown.select(key_expr("_v").alias("key"), pl.col("count").cast(pl.Int64), "id", "value")


def cardinality(vocab: pl.DataFrame) -> int:
    """Rows of the embedding table the column needs: missing, rare, and one per frequent value."""
    return FIRST_ID + int((vocab["id"] >= FIRST_ID).sum())


def ids_of_keys(keys: np.ndarray, vocab: pl.DataFrame) -> np.ndarray:
    """Ids of ``keys`` under ``vocab``; keys it does not hold (missing, unseen) get MISSING_ID."""
    joined = pl.DataFrame({"key": keys}).join(vocab.select("key", "id"), on="key", how="left", maintain_order="left")
    return joined["id"].fill_null(MISSING_ID).to_numpy()


def save_vocabulary(vocab: pl.DataFrame, path) -> None:
    """The vocabulary as Parquet: value (lowercase), count in the train split, id."""
    vocab.select("value", "count", "id").write_parquet(path)


def vocabulary_frame(values: pl.Series, ids: np.ndarray | pl.Series) -> pl.DataFrame:
    """A vocabulary as the transform keeps it: (value text, id)."""
    return pl.DataFrame({"value": values.cast(pl.String), "id": pl.Series(ids).cast(pl.Int64)})


class ValueIndex:
    """Value -> id lookups in one vocabulary without building a hash table per call: each value's two 64-bit hashes
    (Polars' hash under two seeds, computed once), sorted by the first; a looked-up value's pair is searched for
    and must match both (a chance match of two independent 64-bit hashes: about one lookup in 2^128 per value)."""

    def __init__(self, vocabulary: pl.DataFrame):
        self.vocabulary = vocabulary.select("value", "id")
        values = vocabulary["value"]
        first, second = _hashes(values)
        order = np.argsort(first, kind="stable")
        self.first, self.second = first[order], second[order]
        self.ids = vocabulary["id"].to_numpy().astype(np.int64)[order]
        # two values of one first hash (about one vocabulary of 2^32 values in two): always a join instead
        self.collides = bool(len(self.first) > 1 and (np.diff(self.first) == 0).any())

    def lookup(self, first: np.ndarray, second: np.ndarray, missing: np.ndarray) -> np.ndarray:
        """(n,) int64 ids of the values whose hashes (``_hashes``) are ``first`` and ``second``; ``MISSING_ID`` for
        an unseen value or where ``missing``."""
        if not len(self.first) or not len(first):
            return np.zeros(len(first), np.int64)
        place = np.minimum(np.searchsorted(self.first, first), len(self.first) - 1)
        hit = (self.first[place] == first) & (self.second[place] == second) & ~missing
        return np.where(hit, self.ids[place], MISSING_ID).astype(np.int64)

    def by_join(self, n: int) -> bool:
        """Whether ``n`` values are looked up by a join: where the index has two values of one first hash, or ``n``
        is large beside the vocabulary (``JOIN_MIN``, ``JOIN_RATIO``)."""
        return self.collides or (n >= JOIN_MIN and n >= JOIN_RATIO * len(self.ids))

    def __call__(self, text: pl.Series) -> np.ndarray:
        """(n,) int64 ids of ``text`` (String): the vocabulary's, else ``MISSING_ID`` (missing, unseen)."""
        if self.by_join(len(text)):
            joined = text.alias("value").to_frame().join(self.vocabulary, on="value", how="left",
                                                         maintain_order="left")  # fmt: skip
            return joined["id"].fill_null(MISSING_ID).to_numpy().astype(np.int64)
        first, second = _hashes(text)
        return self.lookup(first, second, text.is_null().to_numpy())


def hash_exprs(text: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """The two hashes of each text value that ``ValueIndex.lookup`` takes (computed inside a scorer's own query)."""
    return text.hash(seed=_HASH_SEEDS[0]), text.hash(seed=_HASH_SEEDS[1])


def _hashes(text: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    frame = text.alias("t").to_frame().select(*(h.alias(f"h{i}") for i, h in enumerate(hash_exprs(pl.col("t")))))
    return frame["h0"].to_numpy(), frame["h1"].to_numpy()


def xxh64_ids(text: pl.Series) -> np.ndarray:
    """Raw 64-bit ids of text values: XXH64 of each value's UTF-8 bytes (seed 0) as int64; missing -> 0. Hashed
    once per distinct value. ``preprocess table --raw-ids`` writes these."""
    import xxhash

    distinct = text.drop_nulls().unique()
    hashed = pl.DataFrame({"value": distinct, "raw": pl.Series([xxhash.xxh64_intdigest(v.encode()) for v in
                                                                distinct.to_list()], dtype=pl.UInt64)})  # fmt: skip
    joined = text.alias("value").to_frame().join(hashed, on="value", how="left", maintain_order="left")
    return joined["raw"].fill_null(0).to_numpy().view(np.int64)


def hex_key_ids(text: pl.Series) -> np.ndarray:
    """Raw 64-bit ids of Criteo's hexadecimal values: each value's key (``key_expr``); missing or not a valid value
    -> 0. ``preprocess criteo --raw-ids`` writes these."""
    keys = text.fill_null("").alias("v").to_frame().select(key_expr("v"))
    return keys.to_series().fill_null(0).to_numpy().astype(np.int64)


def sorted_ids(column: pl.Series, vocab: pl.Series) -> np.ndarray:
    """1 + the position of each value of ``column`` in the sorted ``vocab``; 0 for null or absent values."""
    if column.dtype == pl.Utf8:
        index = pl.DataFrame({"v": vocab, "id": np.arange(1, len(vocab) + 1, dtype=np.int32)})
        joined = pl.DataFrame({"v": column}).join(index, on="v", how="left", maintain_order="left")
        return joined["id"].fill_null(0).to_numpy()
    at, found = positions(vocab.to_numpy().astype(np.int64), column.fill_null(-1).to_numpy().astype(np.int64))
    return np.where(found & column.is_not_null().to_numpy(), at + 1, 0).astype(np.int32)


def dense_table(keys: np.ndarray, limit: int) -> np.ndarray | None:
    """For sorted, distinct, non-negative ``keys`` below ``limit``: each id's position in ``keys`` (-1 where
    absent), one entry past the largest key standing for every id out of range; None for other keys."""
    top = int(keys[-1]) if len(keys) else -1
    if not len(keys) or keys[0] < 0 or top >= limit:
        return None
    table = np.full(top + 2, -1, np.int64)
    table[keys] = np.arange(len(keys))
    return table


def positions(keys: np.ndarray, queries: np.ndarray, table: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The position of each query in the sorted, distinct ``keys``, and whether it is there. Ids of raw
    Outbrain columns are small non-negative integers, so a table indexed by id (``dense_table``; pass one
    built once to reuse it) answers directly; other keys go through a binary search."""
    if table is None:
        table = dense_table(keys, max(1 << 22, 2 * len(queries)))
    if table is not None:
        top = len(table) - 2
        at = table[np.where((queries >= 0) & (queries <= top), queries, top + 1)]
        return np.maximum(at, 0), at >= 0
    at = np.searchsorted(keys, queries)
    found = at < len(keys)
    found[found] = keys[at[found]] == queries[found]
    return at, found


def locate(keys: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``positions``, with every position a valid index of ``keys`` (0 where not found) and none found when
    ``keys`` is empty, so ``table[at]`` never fails and ``found`` says which entries mean something."""
    if not len(keys):
        return np.zeros(len(queries), np.int64), np.zeros(len(queries), bool)
    at, found = positions(keys, queries)
    return np.where(found, at, 0), found


def lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``values`` at each query's position in the sorted, distinct ``keys``; ``NULL`` where it is not there."""
    at, found = locate(keys, queries)
    return np.where(found, values[at], NULL) if len(keys) else np.full(len(queries), NULL, np.int64)


def codes(column: pl.Series) -> tuple[np.ndarray, pl.Series]:
    """A text column as int64 codes in the order of its sorted distinct values (``NULL`` where missing), and
    those values."""
    names = column.drop_nulls().unique().sort()
    return np.where(column.is_null().to_numpy(), NULL, sorted_ids(column, names).astype(np.int64) - 1), names
