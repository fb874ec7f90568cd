"""``ctrkit preprocess outbrain``: the raw Kaggle Outbrain Click Prediction files -> a Wide & Deep dataset.

The feature set follows NVIDIA's Wide & Deep workflow (read to learn its definitions; docs/preprocessing.md
says where this differs):

- request level, one-hot: the display's document, its source and publisher, the platform, the geo
  location and its country (first 2 characters) and state (first 5);
- item level, one-hot: ad, advertiser, campaign, the ad's document and its source and publisher;
- multi-hot: the topics, entities and categories of the display's document and of the ad's document,
  each the 3 of highest confidence;
- numerical: the CTR of ad, advertiser, campaign, ad document, ad source and ad publisher over the
  training rows (0 below a minimum count: 5 for ad and ad document, 10 for the others); a training row's
  over the training rows of the other ``ctr_folds`` folds (whole displays; NVIDIA's count the row's own
  label, and leaving only the row out gives it away: docs/decisions/outbrain-ctr-folds.md), the training
  impressions of the ad and of the ad document (log, standardised), the days since each document was
  published (log; missing: the training median), the tf-idf cosine similarity of the two documents'
  categories, topics and entities, and the page views of each document in ``page_views.csv`` (log,
  standardised; the file is streamed, never held).

Split (as NVIDIA's): per display, a random 80% of the displays of days 0-10 train; the other 20% of
those days and every display of later days form the evaluation set (``test``, ordered by display,
with the display id as the ``map`` channel for MAP@12). Vocabularies and statistics come from the
training rows only. Ids seen fewer than ``frequency_threshold`` times in training, and missing
values, map to id 0.

The clicks rows are read in blocks and kept as 9 bytes a row; two passes over blocks (tallies, then
features written as they are computed) make the dataset, so memory follows the other files' tables.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.config import OutbrainPreprocessConfig
from ctrkit.data.atomic import atomic_directory
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.split_binary import DataError, SplitBinaryWriter
from ctrkit.data.synthetic_outbrain import display_spec
from ctrkit.preprocess.output import Rejects

TIMESTAMP_EPOCH_MS = 1465876799998
TRAIN_LAST_DAY = 10
EVAL_SHARE = 0.2
ONEHOT = (
    "document_id", "source_id", "publisher_id", "platform", "geo_location", "geo_location_country",
    "geo_location_state", "ad_id", "advertiser_id", "campaign_id", "document_id_promo", "source_id_promo",
    "publisher_id_promo",
)  # fmt: skip
KINDS = (
    ("topic", "topics", "topic_id"),
    ("entity", "entities", "entity_id"),
    ("category", "categories", "category_id"),
)
MULTI_HOT = tuple(f"{k}_id_list{s}" for s in ("", "_promo") for k, _, _ in KINDS)
CTR_MIN_COUNT = {"ad_id": 5, "advertiser_id": 10, "campaign_id": 10, "document_id_promo": 5,
                 "source_id_promo": 10, "publisher_id_promo": 10}  # fmt: skip
NUMERICAL = (
    *(f"{c}_ctr" for c in CTR_MIN_COUNT), "ad_id_count", "document_id_promo_count",
    "publish_time_days_since_published", "publish_time_promo_days_since_published",
    *(f"document_id_document_id_promo_sim_{k}" for _, k, _ in KINDS), "document_id_views", "document_id_promo_views",
)  # fmt: skip
BAG = 3  # ids per multi-hot feature (highest confidence first)

# file -> (column, type, required); type: int, float, str
SCHEMAS = {
    "clicks_train": (("display_id", "int", True), ("ad_id", "int", True), ("clicked", "int", True)),
    "events": (("display_id", "int", True), ("document_id", "int", True),
               ("timestamp", "int", True), ("platform", "int", False), ("geo_location", "str", False)),
    "promoted_content": (("ad_id", "int", True), ("document_id", "int", True), ("campaign_id", "int", False),
                         ("advertiser_id", "int", False)),
    "documents_meta": (("document_id", "int", True), ("source_id", "int", False), ("publisher_id", "int", False),
                       ("publish_time", "str", False)),
    "documents_topics": (("document_id", "int", True), ("topic_id", "int", True), ("confidence_level", "float", True)),
    "documents_entities": (("document_id", "int", True), ("entity_id", "str", True),
                           ("confidence_level", "float", True)),
    "documents_categories": (("document_id", "int", True), ("category_id", "int", True),
                             ("confidence_level", "float", True)),
}  # fmt: skip
NULLS = ("", "\\N")


@dataclass(frozen=True)
class OutbrainRecipe:
    frequency_threshold: int = 2
    seed: int = 0
    bad_rows: str = "error"
    ctr_folds: int = 10

    def __post_init__(self):
        if self.ctr_folds < 2:
            raise ValueError(f"`ctr_folds`: expected at least 2 folds, got {self.ctr_folds}")


def find_file(raw_dir: Path, name: str) -> Path:
    """``name``.csv (or .csv.gz) in ``raw_dir``; the Kaggle names ``documents_*`` also as ``document_*``."""
    names = [name, name.replace("documents_", "document_")] if name.startswith("documents_") else [name]
    for n in names:
        for ext in (".csv", ".csv.gz"):
            if (raw_dir / f"{n}{ext}").exists():
                return raw_dir / f"{n}{ext}"
    raise DataError(f"{raw_dir}: {name}.csv not found (the raw Kaggle Outbrain files are expected there)")


def read_checked(path: Path, schema: tuple, rejects: Rejects) -> pl.DataFrame:
    """The file's columns cast to their types; rows with a value that does not parse, a required value missing,
    or another number of fields than the header's go to ``rejects`` (line numbers count the header as line 1)."""
    casts = {"int": pl.Int64, "float": pl.Float64, "str": pl.Utf8}
    header = _header(path)
    _require_columns(path, header, schema)
    wrong = _wrong_field_counts(path, header, rejects)
    names = {c for c, _, _ in schema}
    read = dict(columns=[c for c in header if c in names], null_values=list(NULLS), row_index_name="line",
                row_index_offset=2, truncate_ragged_lines=True)  # fmt: skip
    try:  # the fast path: every value parses (then only required columns need a look)
        typed = pl.read_csv(path, schema_overrides={c: casts[t] for c, t, _ in schema}, **read)
        typed = _without_lines(typed, wrong).select([c for c, _, _ in schema])
        if not any(typed[c].null_count() for c, _, required in schema if required):
            return typed
    except Exception:  # a value that does not parse: found below
        pass
    try:
        raw = _without_lines(pl.read_csv(path, infer_schema=False, **read), wrong)
    except Exception as e:  # bad quoting, not a CSV
        raise DataError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    return _checked(path, raw.drop("line"), schema, rejects, raw["line"])[0]


def _header(path: Path) -> list[str]:
    try:
        return pl.read_csv(path, n_rows=0, infer_schema=False).columns
    except Exception as e:  # empty, not a CSV
        raise DataError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None


def _require_columns(path: Path, columns: list[str], schema: tuple) -> None:
    missing = [c for c, _, _ in schema if c not in columns]
    if missing:
        raise DataError(f"{path}: lacks the columns {missing} (header: {columns})")


def _wrong_field_counts(path: Path, header: list[str], rejects: Rejects) -> np.ndarray:
    """The lines of ``path`` whose number of comma-separated fields is not the header's (the raw Outbrain files
    quote nothing, so every comma separates fields), sorted; they go to ``rejects``. Another count means a value
    that holds a comma or a field missing, and the values after it would land in the wrong columns."""
    fields = len(header)
    lines = (
        pl.scan_csv(path, has_header=False, separator="\x1f", quote_char=None, schema={"text": pl.Utf8})
        .with_row_index("line", offset=1)
        .with_columns((pl.col("text").str.count_matches(",", literal=True) + 1).alias("found"))
        .filter(pl.col("found") != fields)
    )
    try:
        wrong = lines.collect(engine="streaming")
    except pl.exceptions.PolarsError as e:
        raise DataError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    shown = [(int(r["line"]), f"expected {fields} comma-separated fields, found {r['found']}", r["text"])
             for r in wrong.head(50).iter_rows(named=True)]  # fmt: skip
    rejects.add(str(path), shown)
    rejects.count += len(wrong) - len(shown)
    return wrong["line"].to_numpy()


def _without_lines(frame: pl.DataFrame, lines: np.ndarray) -> pl.DataFrame:
    """``frame`` without the rows whose ``line`` is one of ``lines``."""
    return frame.filter(~pl.col("line").is_in(pl.Series(lines, dtype=pl.UInt32).implode())) if len(lines) else frame


def _checked(path: Path, raw: pl.DataFrame, schema: tuple, rejects: Rejects, lines: pl.Series) -> tuple:
    """``raw``'s (text) columns of ``schema`` cast to their types, without the rows where a value does not parse
    or a required one is missing; those go to ``rejects`` (``lines``: each row's line number).
    Returns the typed frame and which rows of ``raw`` it kept (None: all)."""
    casts = {"int": pl.Int64, "float": pl.Float64, "str": pl.Utf8}
    typed = raw.select([pl.col(c).cast(casts[t], strict=False).alias(c) for c, t, _ in schema])
    bad_any = np.zeros(len(raw), bool)
    first_problem: dict[int, str] = {}
    for c, t, required in schema:
        value = raw[c]
        bad = (value.is_not_null() & typed[c].is_null()).to_numpy() if t != "str" else np.zeros(len(raw), bool)
        if required:
            bad |= value.is_null().to_numpy()
        for i in np.flatnonzero(bad & ~bad_any)[:50]:
            shown = value[int(i)]
            what = "an integer" if t == "int" else "a number" if t == "float" else "a value"
            first_problem[int(i)] = f"{c}: expected {what}, got {'nothing' if shown is None else repr(shown)}"
        bad_any |= bad
    if bad_any.any():
        rows = np.flatnonzero(bad_any)
        kept = [(int(lines[int(i)]), first_problem.get(int(i), "bad value"), ",".join(
            "" if v is None else str(v) for v in raw.row(int(i)))) for i in rows[:50]]  # fmt: skip
        rejects.add(str(path), kept)
        rejects.count += len(rows) - len(kept)
        return typed.filter(pl.Series(~bad_any)), ~bad_any
    return typed, None


def page_view_counts(path: Path, rejects: Rejects) -> pl.DataFrame:
    """Views per document of ``page_views.csv``, streamed (the real file has 2 billion rows)."""
    scan = pl.scan_csv(path, infer_schema=False, null_values=list(NULLS)).select("document_id")
    counts = (
        scan.with_columns(pl.col("document_id").cast(pl.Int64, strict=False).alias("doc"))
        .group_by("doc")
        .agg(pl.len().alias("views"))
        .collect(engine="streaming")
    )
    bad = counts.filter(pl.col("doc").is_null())
    if len(bad):
        if rejects.policy == "error":
            first = (
                pl.scan_csv(path, infer_schema=False, null_values=list(NULLS)).with_row_index("line", offset=2)
                .filter(pl.col("document_id").cast(pl.Int64, strict=False).is_null())
                .head(1).collect(engine="streaming")
            )  # fmt: skip
            value = first["document_id"][0]
            raise DataError(
                f"{path}:{first['line'][0]}: document_id: expected an integer, got "
                f"{'nothing' if value is None else repr(value)} (set `bad_rows` to skip to drop bad rows)"
            )
        rejects.count += int(bad["views"][0])
    return counts.filter(pl.col("doc").is_not_null()).rename({"doc": "document_id"})


def _pairs(a: np.ndarray, b: np.ndarray) -> tuple[pl.DataFrame, np.ndarray]:
    """The distinct (a, b) pairs of two int columns (ids >= -1) and, per row, the index of its pair."""
    width = int(b.max()) + 2 if len(b) else 1
    distinct, inverse = np.unique((a + 1) * width + (b + 1), return_inverse=True)
    pairs = pl.DataFrame({"a": distinct // width - 1, "b": distinct % width - 1})
    return pairs, inverse.astype(np.int64)


def _vocabulary_ids(column: pl.Series, vocab: pl.Series) -> np.ndarray:
    """1 + the position of each value of ``column`` in the sorted ``vocab``; 0 for null or absent values."""
    if column.dtype == pl.Utf8:
        index = pl.DataFrame({"v": vocab, "id": np.arange(1, len(vocab) + 1, dtype=np.int32)})
        joined = pl.DataFrame({"v": column}).join(index, on="v", how="left", maintain_order="left")
        return joined["id"].fill_null(0).to_numpy()
    at, found = _positions(vocab.to_numpy().astype(np.int64), column.fill_null(-1).to_numpy().astype(np.int64))
    return np.where(found & column.is_not_null().to_numpy(), at + 1, 0).astype(np.int32)


def _dense_table(keys: np.ndarray, limit: int) -> np.ndarray | None:
    """For sorted, distinct, non-negative ``keys`` below ``limit``: each id's position in ``keys`` (-1 where
    absent), one entry past the largest key standing for every id out of range; None for other keys."""
    top = int(keys[-1]) if len(keys) else -1
    if not len(keys) or keys[0] < 0 or top >= limit:
        return None
    table = np.full(top + 2, -1, np.int64)
    table[keys] = np.arange(len(keys))
    return table


def _positions(keys: np.ndarray, queries: np.ndarray, table: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The position of each query in the sorted, distinct ``keys``, and whether it is there. Ids of raw
    Outbrain columns are small non-negative integers, so a table indexed by id (``_dense_table``; pass one
    built once to reuse it) answers directly; other keys go through a binary search."""
    if table is None:
        table = _dense_table(keys, max(1 << 22, 2 * len(queries)))
    if table is not None:
        top = len(table) - 2
        at = table[np.where((queries >= 0) & (queries <= top), queries, top + 1)]
        return np.maximum(at, 0), at >= 0
    at = np.searchsorted(keys, queries)
    found = at < len(keys)
    found[found] = keys[at[found]] == queries[found]
    return at, found


def _split_draw(display: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per display id, a fixed function of (id, seed) (splitmix64)."""
    with np.errstate(over="ignore"):
        z = display.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15) * np.uint64(seed + 1)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _doc_lists(docs: pl.DataFrame, id_col: str) -> pl.DataFrame:
    """document_id -> the (vocabulary) ids of its ``BAG`` highest-confidence values, as a list."""
    return (
        docs.sort(["document_id", "confidence_level", "vid"], descending=[False, True, False])
        .group_by("document_id", maintain_order=True)
        .agg(pl.col("vid").head(BAG).alias("ids"))
    )


def _term_weights(docs: pl.DataFrame) -> pl.DataFrame:
    """Each document's unit-length tf-idf vector over one kind of term: (document_id, vid, u), sorted."""
    n_docs = max(docs["document_id"].n_unique(), 1)
    df = docs.group_by("vid").agg(pl.len().alias("df"))
    weighted = docs.join(df, on="vid").with_columns(
        (pl.col("confidence_level") * (np.log(n_docs) - pl.col("df").log())).alias("w")
    )
    norms = weighted.group_by("document_id").agg((pl.col("w") ** 2).sum().sqrt().alias("norm"))
    weighted = weighted.join(norms, on="document_id").with_columns((pl.col("w") / pl.col("norm")).alias("u"))
    return weighted.select("document_id", "vid", "u").sort("document_id", "vid")


class _TermRows:
    """A term table sorted by document_id (``_term_weights``) and, for each of its documents, where its rows
    start and end: any set of documents' rows are then taken without searching the whole table."""

    def __init__(self, frame: pl.DataFrame):
        self.frame = frame
        column = frame["document_id"].to_numpy()
        starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]]) if len(column) else np.zeros(0, np.int64)
        self.docs = column[starts].astype(np.int64)  # distinct, ascending
        self.bounds = np.append(starts, len(column))  # document k's rows: bounds[k] .. bounds[k + 1] - 1
        # raw Outbrain document ids are small non-negative integers: a position per id, built once
        self.dense = _dense_table(self.docs, max(1 << 22, 4 * len(self.docs)))

    def of(self, docs: np.ndarray) -> pl.DataFrame:
        """The rows of ``docs`` (distinct ids, -1 or absent ones have none), in table order."""
        at, found = _positions(self.docs, docs, self.dense)
        lo = np.where(found, self.bounds[at], 0)
        lengths = np.where(found, self.bounds[np.minimum(at + 1, len(self.docs))] - lo, 0)
        # the row numbers lo[i] .. lo[i] + lengths[i] - 1 of every document, concatenated
        starts = np.repeat(lo - np.cumsum(lengths) + lengths, lengths)
        return self.frame[starts + np.arange(int(lengths.sum()))]


def _similarity(terms: _TermRows, pairs: pl.DataFrame) -> np.ndarray:
    """tf-idf cosine similarity of (document_id, document_id_promo) ``pairs`` (columns a, b) over one kind of
    term (``_term_weights``). Each pair's products are summed in term order, so a pair's value does not depend
    on which other pairs are asked for with it. Only the terms of the pairs' documents are joined (found by
    their row ranges), so a block's cost follows its own documents, not the whole table's."""
    unique = pairs.unique()  # missing documents are -1: no terms, similarity 0
    side = {c: terms.of(np.unique(unique[c].to_numpy())) for c in ("a", "b")}
    dots = (
        unique.join(side["a"].rename({"document_id": "a", "u": "ua"}), on="a")
        .join(side["b"].rename({"document_id": "b", "u": "ub"}), on=["b", "vid"])
        .sort("a", "b", "vid")
        .group_by(["a", "b"], maintain_order=True)
        .agg((pl.col("ua") * pl.col("ub")).sum().alias("sim"))
    )
    out = pairs.join(dots, on=["a", "b"], how="left", maintain_order="left")["sim"].fill_null(0.0).fill_nan(0.0)
    return out.to_numpy().astype(np.float32)


def outbrain_spec(cardinalities: dict[str, int], base: Path | None = None, metadata: dict | None = None) -> FeatureSpec:
    return display_spec(
        {n: cardinalities[n] for n in ONEHOT}, {n: cardinalities[n] for n in MULTI_HOT}, NUMERICAL, "sum",
        metadata or {}, base,
    )  # fmt: skip


NULL = np.iinfo(np.int64).min  # a missing value in the int64 id columns below (raw ids are not this)
BLOCK_ROWS = OutbrainPreprocessConfig.block_rows  # clicks rows per block of the two passes
DAY_MS = 86_400_000
MAX_DAYS = 3650  # days since published: 0 outside 0..MAX_DAYS
REQUEST = ONEHOT[:7]  # from the display's event and its document
ITEM = ("advertiser_id", "campaign_id", "document_id_promo", "source_id_promo", "publisher_id_promo")
PROMO_COLUMN = {"advertiser_id": "advertiser_id", "campaign_id": "campaign_id", "document_id_promo": "document_id"}
assert ONEHOT == (*REQUEST, "ad_id", *ITEM)


def _ints(series: pl.Series) -> np.ndarray:
    """An integer column as int64, ``NULL`` where missing."""
    return series.cast(pl.Int64).fill_null(NULL).to_numpy().astype(np.int64, copy=False)


def _locate(keys: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_positions``, with every position a valid index of ``keys`` (0 where not found) and none found when
    ``keys`` is empty, so ``table[at]`` never fails and ``found`` says which entries mean something."""
    if not len(keys):
        return np.zeros(len(queries), np.int64), np.zeros(len(queries), bool)
    at, found = _positions(keys, queries)
    return np.where(found, at, 0), found


def _lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``values`` at each query's position in the sorted, distinct ``keys``; ``NULL`` where it is not there."""
    at, found = _locate(keys, queries)
    return np.where(found, values[at], NULL) if len(keys) else np.full(len(queries), NULL, np.int64)


def _codes(column: pl.Series) -> tuple[np.ndarray, pl.Series]:
    """A text column as int64 codes in the order of its sorted distinct values (``NULL`` where missing), and
    those values."""
    names = column.drop_nulls().unique().sort()
    return np.where(column.is_null().to_numpy(), NULL, _vocabulary_ids(column, names).astype(np.int64) - 1), names


class _Tally:
    """Sums per int64 key over blocks of rows: a count and ``weights`` more sums (``NULL`` keys skipped).
    Keys in [0, 2^25) are summed in dense arrays, others (rare in raw Outbrain ids) sorted and merged."""

    DENSE = 1 << 25

    def __init__(self, weights: int = 0):
        self.dense = np.zeros((1 + weights, 0), np.int64)
        self.sparse: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, keys: np.ndarray, *weights: np.ndarray) -> None:
        dense = (keys >= 0) & (keys < self.DENSE)
        if not dense.all():
            other = (keys != NULL) & ~dense
            if other.any():
                distinct, inverse = np.unique(keys[other], return_inverse=True)
                sums = [np.bincount(inverse, minlength=len(distinct))]
                sums += [np.bincount(inverse, w[other], len(distinct)).astype(np.int64) for w in weights]
                self.sparse.append((distinct, np.stack(sums)))
            keys, weights = keys[dense], [w[dense] for w in weights]
        if not len(keys):
            return
        top = int(keys.max()) + 1
        if top > self.dense.shape[1]:
            grown = np.zeros((self.dense.shape[0], max(top, 2 * self.dense.shape[1])), np.int64)
            grown[:, : self.dense.shape[1]] = self.dense
            self.dense = grown
        self.dense[0, :top] += np.bincount(keys, minlength=top)  # up to the block's largest key only
        for i, w in enumerate(weights, 1):
            self.dense[i, :top] += np.bincount(keys, w, top).astype(np.int64)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys seen (sorted) and their sums, (1 + weights, keys): the count first."""
        seen = np.flatnonzero(self.dense[0])
        keys, sums = [seen.astype(np.int64)], [self.dense[:, seen]]
        if self.sparse:
            all_keys = np.concatenate([k for k, _ in self.sparse])
            distinct, inverse = np.unique(all_keys, return_inverse=True)
            stacked = np.concatenate([v for _, v in self.sparse], axis=1)
            keys.append(distinct)
            sums.append(np.stack([np.bincount(inverse, row, len(distinct)).astype(np.int64) for row in stacked]))
        keys, sums = np.concatenate(keys), np.concatenate(sums, axis=1)
        order = np.argsort(keys, kind="stable")
        return keys[order], sums[:, order]


def _standardisation(values: np.ndarray, counts: np.ndarray, total: int) -> tuple[float, float]:
    """Mean and standard deviation over ``total`` training rows of which ``counts`` hold each of ``values``
    and the rest 0."""
    if total <= 0:
        return 0.0, 1.0
    mean = float(np.dot(counts, values)) / total
    spread = float(np.dot(counts, (values - mean) ** 2)) + (total - int(counts.sum())) * mean**2
    std = (spread / total) ** 0.5
    return mean, std if std > 0 else 1.0


def _median_of_counts(counts: np.ndarray) -> float:
    """The median of the integers 0..len-1 seen ``counts`` times (0 when none)."""
    n = int(counts.sum())
    if not n:
        return 0.0
    ends = np.cumsum(counts)
    lo, hi = np.searchsorted(ends, (n - 1) // 2, side="right"), np.searchsorted(ends, n // 2, side="right")
    return (float(lo) + float(hi)) / 2


@dataclass
class _Tables:
    """The files other than clicks and page views, as sorted keys and columns for lookups: events by
    display, promoted content by ad, documents by id, and per kind of document term the bags and tf-idf
    vectors. Their size follows the events and documents, not the clicks rows."""

    display: np.ndarray  # events, sorted by display_id
    ev_doc: np.ndarray
    ev_when: np.ndarray  # ms since 1970
    ev_platform: np.ndarray
    ev_geo: np.ndarray  # codes of geo_location
    ev_fold: np.ndarray  # int8: the CTR fold of a training display, -1 for an evaluation one
    geo_parts: np.ndarray  # per geo code: its code, its country's and its state's (3, codes)
    promo_ad: np.ndarray  # promoted content, sorted by ad_id
    promo: dict[str, np.ndarray]
    meta_doc: np.ndarray  # documents, sorted by document_id
    meta: dict[str, np.ndarray]  # source_id, publisher_id, published (ms since 1970)
    bags: dict[str, tuple[np.ndarray, np.ndarray, int]]  # kind -> documents with terms, padded bags, vocabulary
    terms: dict[str, _TermRows]  # plural -> _term_weights' table
    views_doc: np.ndarray
    views: np.ndarray

    @classmethod
    def load(cls, raw_dir: Path, recipe: OutbrainRecipe, rejects: Rejects) -> _Tables:
        """The tables, without the page views (``with_views``)."""
        t = {name: read_checked(find_file(raw_dir, name), SCHEMAS[name], rejects)
             for name in SCHEMAS if name != "clicks_train"}  # fmt: skip
        events = t.pop("events").unique("display_id", keep="first", maintain_order=True).sort("display_id")
        display = events["display_id"].to_numpy().astype(np.int64)
        stamp = events["timestamp"].to_numpy().astype(np.int64)
        draw = _split_draw(display, recipe.seed)
        train = (stamp // DAY_MS <= TRAIN_LAST_DAY) & (draw >= EVAL_SHARE)
        # a training display's fold: a fixed function of its draw (whole displays per fold)
        folds = recipe.ctr_folds
        fold = np.minimum(((draw - EVAL_SHARE) / (1 - EVAL_SHARE) * folds).astype(np.int64), folds - 1)
        geo, geo_names = _codes(events["geo_location"])
        parts = [np.arange(len(geo_names), dtype=np.int64)]
        for width in (2, 5):  # country, state: the first characters, coded in their own sorted order
            parts.append(_codes(geo_names.str.slice(0, width))[0])
        tables = dict(
            display=display, ev_doc=_ints(events["document_id"]), ev_when=stamp + TIMESTAMP_EPOCH_MS,
            ev_platform=_ints(events["platform"]), ev_geo=geo,
            ev_fold=np.where(train, fold, -1).astype(np.int8), geo_parts=np.stack(parts),
        )  # fmt: skip
        del events, stamp, draw, train, fold
        meta = t.pop("documents_meta").unique("document_id", keep="first", maintain_order=True).sort("document_id")
        published = meta["publish_time"].str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False).dt.epoch("ms")
        tables["meta_doc"] = meta["document_id"].to_numpy().astype(np.int64)
        tables["meta"] = {"source_id": _ints(meta["source_id"]), "publisher_id": _ints(meta["publisher_id"]),
                          "published": _ints(published)}  # fmt: skip
        del meta, published
        promo = t.pop("promoted_content").unique("ad_id", keep="first", maintain_order=True).sort("ad_id")
        tables["promo_ad"] = promo["ad_id"].to_numpy().astype(np.int64)
        columns = {name: _ints(promo[col]) for name, col in PROMO_COLUMN.items()}
        for name in ("source_id", "publisher_id", "published"):  # the ad's document's, looked up once per ad
            columns[f"{name}_promo"] = _lookup(tables["meta_doc"], tables["meta"][name], columns["document_id_promo"])
        tables["promo"] = columns
        del promo
        tables["bags"], tables["terms"] = {}, {}
        for kind, plural, id_col in KINDS:
            docs = t.pop(f"documents_{plural}").unique(["document_id", id_col], keep="first", maintain_order=True)
            vocab = docs.select(id_col).unique().sort(id_col).with_row_index("vid", offset=1)
            docs = docs.join(vocab, on=id_col, maintain_order="left").select(
                "document_id", pl.col("vid").cast(pl.Int64), "confidence_level"
            )
            lists = _doc_lists(docs, id_col)
            with_bag = lists["document_id"].to_numpy().astype(np.int64)  # sorted (group_by kept the sort order)
            lengths = lists["ids"].list.len().to_numpy().astype(np.int64)
            flat = lists["ids"].explode().to_numpy().astype(np.int32)
            padded = np.full((len(lists) + 1, BAG), -1, np.int32)  # the last row: documents without any
            within = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            padded[np.repeat(np.arange(len(lists)), lengths), within] = flat
            tables["bags"][kind] = (with_bag, padded, len(vocab) + 1)
            tables["terms"][plural] = _TermRows(_term_weights(docs))
        return cls(**tables, views_doc=np.zeros(0, np.int64), views=np.zeros(0, np.int64))

    def with_views(self, views: pl.DataFrame) -> None:
        """Page views per document (``page_view_counts``)."""
        views = views.sort("document_id")
        self.views_doc = views["document_id"].to_numpy().astype(np.int64)
        self.views = views["views"].to_numpy().astype(np.int64)

    def block(self, event: np.ndarray, ad: np.ndarray) -> dict[str, np.ndarray]:
        """The columns of a block of clicks rows (their events' positions, their ads): the 13 one-hot features'
        raw values (n, 13) int64 (``NULL`` for missing), and the rows' fold, display, event time and the
        two documents' publish times."""
        doc = self.ev_doc[event]
        page = _locate(self.meta_doc, doc)  # the page's document's row of documents_meta (looked up once)
        item = _locate(self.promo_ad, ad)  # the ad's row of promoted_content

        def of(columns: dict, name: str, where: tuple) -> np.ndarray:
            at, found = where
            return np.where(found, columns[name][at], NULL) if found.any() else np.full(len(at), NULL, np.int64)

        def of_page(name):
            return of(self.meta, name, page)

        def of_ad(name):
            return of(self.promo, name, item)

        geo = self.ev_geo[event]
        known = geo != NULL
        geo_part = [np.where(known, part[np.where(known, geo, 0)], NULL) if len(part) else geo
                    for part in self.geo_parts]  # fmt: skip

        values = np.stack([doc, of_page("source_id"), of_page("publisher_id"), self.ev_platform[event], *geo_part,
                           ad, *(of_ad(name) for name in ITEM)], axis=1)  # fmt: skip
        return {"onehot": values, "fold": self.ev_fold[event].astype(np.int64), "display": self.display[event],
                "when": self.ev_when[event], "published": of_page("published"),
                "published_promo": of_ad("published_promo")}  # fmt: skip


def _days_since(when: np.ndarray, published: np.ndarray) -> np.ndarray:
    """Whole days from publication to the event, 0 outside 0..MAX_DAYS, -1 where the publish time is missing."""
    known = published != NULL
    delta = when - np.where(known, published, 0)
    days = np.where(delta >= 0, delta // DAY_MS, 0)
    return np.where(known, np.where(days <= MAX_DAYS, days, 0), -1)


def _read_clicks(path: Path, display: np.ndarray, rejects: Rejects, block_rows: int, bar) -> tuple:
    """``clicks_train.csv`` streamed: per good row the position of its display among the sorted event
    displays (int32), its ad id (int32 where it fits) and its label; what is held is those 9 bytes a row.
    Bad rows (a value that does not parse or is missing, a label other than 0 and 1, a display not in
    events.csv) go to ``rejects``. Returns (events, ads, labels, rows read)."""
    schema = SCHEMAS["clicks_train"]
    header = _header(path)
    _require_columns(path, header, schema)
    wrong = _wrong_field_counts(path, header, rejects)
    scan = pl.scan_csv(path, infer_schema=False, null_values=list(NULLS), truncate_ragged_lines=True)
    scan = scan.select([c for c, _, _ in schema]).with_row_index("line", offset=2)
    if len(wrong):
        scan = scan.filter(~pl.col("line").is_in(pl.Series(wrong, dtype=pl.UInt32).implode()))
    events, ads, labels, read = [], [], [], len(wrong)
    try:
        for batch in scan.collect_batches(chunk_size=block_rows):
            read += len(batch)
            typed, kept = _checked(path, batch.drop("line"), schema, rejects, batch["line"])
            lines = batch["line"] if kept is None else batch["line"].filter(pl.Series(kept))
            label = typed["clicked"].to_numpy()
            bad = (label != 0) & (label != 1)
            if bad.any():
                bad_rows = np.flatnonzero(bad)
                shown = [(int(lines[int(i)]), f"clicked: expected 0 or 1, got {label[i]}",
                          ",".join(str(v) for v in typed.row(int(i)))) for i in bad_rows[:50]]  # fmt: skip
                rejects.add(str(path), shown)
                rejects.count += max(len(bad_rows) - 50, 0)
            ids = typed["display_id"].to_numpy()
            at, found = _positions(display, ids)
            orphan = ~found & ~bad
            if orphan.any():  # clicks rows whose display is not in events.csv
                i = int(np.flatnonzero(orphan)[0])
                if rejects.policy == "error":
                    raise DataError(f"{path}:{int(lines[i])}: display_id {ids[i]} is not in events.csv "
                                    "(set `bad_rows` to skip to drop bad rows)")  # fmt: skip
                rejects.count += int(orphan.sum())
            keep = found & ~bad
            events.append(at[keep].astype(np.int32))
            ad = typed["ad_id"].to_numpy()[keep]
            narrow = not len(ad) or (ad.min() > np.iinfo(np.int32).min and ad.max() <= np.iinfo(np.int32).max)
            ads.append(ad.astype(np.int32) if narrow else ad)  # int64 only where an id needs it
            labels.append(label[keep].astype(np.uint8))
            bar.update(len(batch))
    except pl.exceptions.PolarsError as e:  # bad quoting, not a CSV
        raise DataError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    if not events:
        return np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.uint8), read
    return np.concatenate(events), np.concatenate(ads), np.concatenate(labels), read


def preprocess_outbrain(
    raw_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    recipe: OutbrainRecipe = OutbrainRecipe(),
    overwrite: bool = False,
    progress: bool = True,
    engine: str = "polars",
    master: str = "local[*]",
    block_rows: int = BLOCK_ROWS,
) -> dict:
    """Runs the recipe; returns the summary also written to ``summary.json``.

    The clicks rows go through in blocks of ``block_rows``, twice: a first pass tallies the training rows'
    vocabularies and statistics, a second computes each block's features and writes them. Besides the other
    files' tables, 9 bytes a clicks row are held (the output does not depend on ``block_rows``). Rows are
    written in display order (the order of the Kaggle file); evaluation rows grouped by display.

    ``engine`` "spark" counts ``page_views.csv`` (the real data's 2 billion rows) on Spark (``master``);
    the other files are read here with the same code, so both engines write byte-identical datasets."""
    from tqdm.auto import tqdm

    started = time.perf_counter()
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise DataError(f"{raw_dir}: not a directory of raw Outbrain files")
    if engine not in ("polars", "spark"):
        raise ValueError(f"`engine`: expected polars or spark, got {engine!r}")
    if recipe.frequency_threshold < 1:
        raise ValueError(f"`frequency_threshold`: expected an integer >= 1, got {recipe.frequency_threshold}")
    if block_rows < 1:
        raise ValueError(f"`block_rows`: expected an integer >= 1, got {block_rows}")
    rejects = Rejects(recipe.bad_rows)
    for name in (*SCHEMAS, "page_views"):  # every file is there before any is read
        find_file(raw_dir, name)
    tables = _Tables.load(raw_dir, recipe, rejects)
    if engine == "spark":
        from ctrkit.preprocess.spark_engine import page_view_counts_spark, start_session

        tables.with_views(page_view_counts_spark(find_file(raw_dir, "page_views"), rejects, start_session(master)))
    else:
        tables.with_views(page_view_counts(find_file(raw_dir, "page_views"), rejects))
    bar = tqdm(desc="read clicks", unit=" rows", unit_scale=True, disable=not progress)
    event, ad, label, clicks_read = _read_clicks(find_file(raw_dir, "clicks_train"), tables.display, rejects,
                                                 block_rows, bar)  # fmt: skip
    bar.close()
    # rows in display order (events are sorted by display), so that evaluation rows come out grouped by display
    order = None if np.all(event[1:] >= event[:-1]) else np.argsort(event, kind="stable")

    def blocks(desc: str):
        with tqdm(total=len(event), desc=desc, unit=" rows", unit_scale=True, disable=not progress) as b:
            for lo in range(0, len(event), block_rows):
                rows = slice(lo, lo + block_rows) if order is None else order[lo : lo + block_rows]
                yield event[rows], ad[rows], label[rows]
                b.update(min(block_rows, len(event) - lo))

    # pass 1: the training rows' vocabularies and statistics
    folds = recipe.ctr_folds
    counts = [_Tally() for _ in ONEHOT]
    ctr_tallies = {name: _Tally(weights=1) for name in CTR_MIN_COUNT}
    day_counts = {side: np.zeros(MAX_DAYS + 1, np.int64) for side in ("published", "published_promo")}
    n_train = 0
    for ev, ads, y in blocks("tally"):
        cols = tables.block(ev, ads)
        train = cols["fold"] >= 0
        n_train += int(train.sum())
        values = cols["onehot"][train]
        for f, tally in enumerate(counts):
            tally.add(values[:, f])
        fold, clicked = cols["fold"][train], y[train].astype(np.int64)
        for name, tally in ctr_tallies.items():
            v = values[:, ONEHOT.index(name)]
            tally.add(np.where(v != NULL, v * folds + fold, NULL), clicked)
        for side, hist in day_counts.items():
            days = _days_since(cols["when"][train], cols[side][train])
            hist += np.bincount(days[days >= 0], minlength=MAX_DAYS + 1)
    onehot_counts = [tally.result() for tally in counts]
    vocabs = [keys[sums[0] >= recipe.frequency_threshold] for keys, sums in onehot_counts]
    cards = {name: len(vocab) + 1 for name, vocab in zip(ONEHOT, vocabs)}
    for kind, _, _ in KINDS:
        for suffix in ("", "_promo"):
            cards[f"{kind}_id_list{suffix}"] = tables.bags[kind][2]
    ctr_stats = {}
    for name, tally in ctr_tallies.items():
        keys, sums = tally.result()
        value, fold = keys // folds, keys % folds
        distinct, inverse = np.unique(value, return_inverse=True)
        per_fold = np.zeros((2, len(distinct), folds), np.int64)
        per_fold[:, inverse, fold] = sums
        total = per_fold.sum(axis=2)
        ctr_stats[name] = (distinct, total, per_fold)
    standard = {}
    for name in ("ad_id", "document_id_promo"):  # log training impressions, standardised over the training rows
        distinct, total, _ = ctr_stats[name]
        standard[f"{name}_count"] = _standardisation(np.log1p(total[0].astype(np.float64)), total[0], n_train)
    for name in ("document_id", "document_id_promo"):  # log page views of the document, standardised likewise
        keys, sums = onehot_counts[ONEHOT.index(name)]
        seen = np.log1p(np.maximum(_lookup(tables.views_doc, tables.views, keys), 0).astype(np.float64))
        standard[f"{name}_views"] = _standardisation(seen, sums[0], n_train)
    medians = {side: _median_of_counts(hist) for side, hist in day_counts.items()}

    # pass 2: each block's features, written as they are computed
    meta_info = {"generator": "ctrkit preprocess outbrain", "frequency_threshold": recipe.frequency_threshold,
                 "seed": recipe.seed, "ctr_folds": recipe.ctr_folds}  # fmt: skip
    written = {"train": 0, "test": 0}
    with atomic_directory(out_dir, overwrite) as tmp:
        spec = outbrain_spec(cards, tmp, meta_info)
        with SplitBinaryWriter(spec, "train") as train_out, SplitBinaryWriter(spec, "test") as test_out:
            for ev, ads, y in blocks("features"):
                cols = tables.block(ev, ads)
                onehot, numerical, bags = _features(cols, tables, vocabs, ctr_stats, standard, medians)
                train = cols["fold"] >= 0
                for mapping, writer, idx in (("train", train_out, np.flatnonzero(train)),
                                             ("test", test_out, np.flatnonzero(~train))):  # fmt: skip
                    if mapping == "test":  # grouped by display (MAP@12)
                        idx = idx[np.argsort(cols["display"][idx], kind="stable")]
                    multi = []
                    for name in MULTI_HOT:
                        mine = bags[name][idx]
                        keep = mine >= 0
                        multi.append((mine[keep], keep.sum(axis=1, dtype=np.int32)))
                    writer.append(numerical[idx], onehot[idx], y[idx], multi,
                                  cols["display"][idx] if mapping == "test" else None)  # fmt: skip
                    written[mapping] += len(idx)
        spec.to_yaml(tmp / "feature_spec.yaml")
        seconds = time.perf_counter() - started
        summary = {
            "engine": engine,
            "recipe": "outbrain",
            "rows": written,
            "clicks_rows_read": int(clicks_read),
            "bad_rows": rejects.count,
            "bad_row_examples": rejects.kept,
            "cardinalities": cards,
            "seconds": round(seconds, 3),
            "clicks_rows_per_second": round(clicks_read / max(seconds, 1e-9)),
        }
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _features(cols: dict, tables: _Tables, vocabs: list, ctr_stats: dict, standard: dict, medians: dict) -> tuple:
    """A block's one-hot ids (n, 13) int32, numerical features (n, 15) float32 and padded multi-hot bags
    (name -> (n, BAG) int32, -1 past a bag's end), from the first pass's vocabularies and statistics."""
    raw = cols["onehot"]
    n = len(raw)
    onehot = np.empty((n, len(ONEHOT)), np.int32)
    for f, vocab in enumerate(vocabs):
        at, found = _locate(vocab, raw[:, f])
        onehot[:, f] = np.where(found, at + 1, 0)
    # NaN until put: the writer refuses those, so a feature left unset cannot pass silently
    numerical = np.full((n, len(NUMERICAL)), np.nan, np.float32)

    def put(name: str, values) -> None:
        numerical[:, NUMERICAL.index(name)] = np.asarray(values, dtype=np.float32)

    fold = cols["fold"]
    train = fold >= 0
    for name, minimum in CTR_MIN_COUNT.items():
        distinct, total, per_fold = ctr_stats[name]
        at, found = _locate(distinct, raw[:, ONEHOT.index(name)])
        if len(distinct):
            shown = np.where(found, total[0, at], 0)
            clicks = np.where(found, total[1, at], 0)
            # a training row's CTR leaves out its own fold's rows (its display's, its own click included)
            mine = found & train
            own = np.where(mine, fold, 0)
            shown_seen = shown - np.where(mine, per_fold[0, at, own], 0)
            clicks_seen = clicks - np.where(mine, per_fold[1, at, own], 0)
        else:  # no training row has a value
            shown = clicks = shown_seen = clicks_seen = np.zeros(n, np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            put(f"{name}_ctr", np.where(shown_seen >= minimum, clicks_seen / np.maximum(shown_seen, 1), 0.0))
        if name in ("ad_id", "document_id_promo"):
            mean, std = standard[f"{name}_count"]
            put(f"{name}_count", (np.log1p(shown.astype(np.float64)) - mean) / std)
    for col, side in (("publish_time_days_since_published", "published"),
                      ("publish_time_promo_days_since_published", "published_promo")):  # fmt: skip
        days = _days_since(cols["when"], cols[side]).astype(np.float64)
        put(col, np.log1p(np.where(days < 0, medians[side], days)))
    for name in ("document_id", "document_id_promo"):
        seen = np.maximum(_lookup(tables.views_doc, tables.views, raw[:, ONEHOT.index(name)]), 0)
        mean, std = standard[f"{name}_views"]
        put(f"{name}_views", (np.log1p(seen.astype(np.float64)) - mean) / std)
    # multi-hot: each document's 3 most confident terms, gathered by document; the similarities are computed
    # once per distinct (page document, ad document) pair
    doc_ids = {"": raw[:, ONEHOT.index("document_id")],
               "_promo": raw[:, ONEHOT.index("document_id_promo")]}  # fmt: skip
    doc_ids = {side: np.where(d == NULL, -1, d) for side, d in doc_ids.items()}
    pairs, pair_of_row = _pairs(doc_ids[""], doc_ids["_promo"])
    bags = {}
    for kind, plural, _ in KINDS:
        with_bag, padded, _ = tables.bags[kind]
        for suffix, docs_of_row in doc_ids.items():
            at, found = _locate(with_bag, docs_of_row)
            bags[f"{kind}_id_list{suffix}"] = padded[np.where(found, at, len(with_bag))]  # the last row: no terms
        put(f"document_id_document_id_promo_sim_{plural}", _similarity(tables.terms[plural], pairs)[pair_of_row])
    return onehot, numerical, bags
