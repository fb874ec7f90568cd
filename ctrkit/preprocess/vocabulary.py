"""Categorical vocabularies: the one id rule (``assign_ids``) and a later day's extension of a model's vocabulary
(``extend``), for every recipe; the Criteo recipe's value keys, lookup, and the Parquet form.

A category is a hexadecimal number written with a given number of digits, so ``"0a"`` and ``"a"`` are
different values while ``"A1"`` and ``"a1"`` are the same one. Every value is held as one int64
*key*, ``int(value, 16) + (len(value) << 60)`` modulo 2**64 (values of 8 or more digits have the top
bit set, so their int64 keys are negative): exact and injective for up to 15 digits, and read as
unsigned its order is the recipe's tie-break order (fewer digits first, then the number, i.e. plain
string order for Criteo's fixed-width lowercase hashes). The empty (missing) value has key 0. Both engines
count keys and build ids with the functions here, which is what makes their outputs identical.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ctrkit.preprocess.criteo import FIRST_ID, MISSING_ID, RARE_ID

MAX_DIGITS = 15
LENGTH_SHIFT = 60
MISSING_KEY = 0


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
