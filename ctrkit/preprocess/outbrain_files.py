"""The raw Outbrain files: their schemas, the recipe, reading each (header and field counts checked, a bad line named
or skipped under the bad-row policy), page_views.csv streamed into counts, and the array lookups the features use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit import splitmix
from ctrkit.columns import label_of
from ctrkit.data.feature_spec import check_capacity
from ctrkit.data.split_binary import DataError
from ctrkit.data_config import OutbrainPreprocessConfig
from ctrkit.field_types import CTR_FOLDS, FREQUENCY_THRESHOLD, SEED
from ctrkit.preprocess.output import Rejects
from ctrkit.preprocess.table_reader import header_names
from ctrkit.preprocess.vocabulary import NULL

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
    "clicks_train": (("display_id", "int", True), ("ad_id", "int", True), ("clicked", "label", True)),
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


# a raw row to score (``outbrain_transform.OutbrainTransform``): an event of ``events.csv`` and an ad, as their
# files' schemas read them
REQUEST_SCHEMA = (("ad_id", "int", True), ("document_id", "int", True), ("timestamp", "int", True),
                  ("platform", "int", False), ("geo_location", "str", False))  # fmt: skip


CASTS = {"int": pl.Int64, "float": pl.Float64, "str": pl.Utf8}


@dataclass(frozen=True)
class OutbrainRecipe:
    frequency_threshold: int = 2
    seed: int = 0
    bad_rows: str = "error"
    ctr_folds: int = 10
    raw_ids: tuple[str, ...] = ()  # one-hot columns kept as raw 64-bit ids (the files' integer ids; missing 0)
    capacity: int | None = None  # rows of each raw-id column's table (None: its vocabulary's)

    def __post_init__(self):
        FREQUENCY_THRESHOLD.check("frequency_threshold", self.frequency_threshold)
        CTR_FOLDS.check("ctr_folds", self.ctr_folds)
        SEED.check("seed", self.seed)
        allowed = [c for c in ONEHOT if not c.startswith("geo_location")]
        bad = [c for c in self.raw_ids if c not in allowed]
        if bad:
            raise ValueError(
                f"`raw_ids`: '{bad[0]}' is not an integer id column of the recipe; expected some of "
                f"{', '.join(allowed)} (geo_location values are text and keep their vocabularies)"
            )
        check_capacity(self.capacity)


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
    header = read_header(path)
    require_columns(path, header, schema)
    wrong = wrong_field_counts(path, header, rejects)
    names = {c for c, _, _ in schema}
    read = dict(columns=[c for c in header if c in names], null_values=list(NULLS), row_index_name="line",
                row_index_offset=2, truncate_ragged_lines=True)  # fmt: skip
    try:  # the fast path: every value parses (then only required columns need a look)
        typed = pl.read_csv(path, schema_overrides={c: CASTS[t] for c, t, _ in schema}, **read)
        typed = without_lines(typed, wrong).select([c for c, _, _ in schema])
        if not any(typed[c].null_count() for c, _, required in schema if required):
            return typed
    except Exception:  # a value that does not parse: found below
        pass
    try:
        raw = without_lines(pl.read_csv(path, infer_schema=False, **read), wrong)
    except Exception as e:  # bad quoting, not a CSV
        raise DataError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    return checked(path, raw.drop("line"), schema, rejects, raw["line"])[0]


def read_header(path: Path) -> list[str]:
    """The header's column names, read by the rules of a user's table (``table_reader.header_names``): UTF-8, a
    first line naming the columns, line ends \n or \r\n, no name twice; else a one-line error naming the file."""
    try:
        return header_names(path, ",", separator_flags=None)  # the Kaggle files: commas, no flag to change it
    except ValueError as e:
        raise DataError(str(e)) from None


def require_columns(path: Path, columns: list[str], schema: tuple) -> None:
    missing = [c for c, _, _ in schema if c not in columns]
    if missing:
        raise DataError(f"{path}: lacks the columns {missing} (header: {columns})")


def wrong_field_counts(path: Path, header: list[str], rejects: Rejects) -> np.ndarray:
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


def without_lines(frame: pl.DataFrame, lines: np.ndarray) -> pl.DataFrame:
    """``frame`` without the rows whose ``line`` is one of ``lines``."""
    return frame.filter(~pl.col("line").is_in(pl.Series(lines, dtype=pl.UInt32).implode())) if len(lines) else frame


def value_bad(values: pl.Series, kind: str) -> np.ndarray:
    """Which values of a column of ``kind`` (int, float) are given and do not parse: the one rule for a raw Outbrain
    value, of the fit (``checked``) and of a scorer (``OutbrainTransform``)."""
    return (values.is_not_null() & values.cast(CASTS[kind], strict=False).is_null()).to_numpy()


def checked(path: Path, raw: pl.DataFrame, schema: tuple, rejects: Rejects, lines: pl.Series) -> tuple:
    """``raw``'s (text) columns of ``schema`` cast to their types, without the rows where a value does not parse
    or a required one is missing; those go to ``rejects`` (``lines``: each row's line number).
    Returns the typed frame and which rows of ``raw`` it kept (None: all)."""
    typed = raw.select([label_of(pl.col(c), c)[0].alias(c) if t == "label" else
                        pl.col(c).cast(CASTS[t], strict=False).alias(c) for c, t, _ in schema])  # fmt: skip
    bad_any = np.zeros(len(raw), bool)
    first_problem: dict[int, str] = {}
    for c, t, required in schema:
        value = raw[c]
        if t == "label":  # the one label rule (``columns.label_of``), its words
            problems = raw.select(label_of(pl.col(c), c)[1]).to_series()
            bad = problems.is_not_null().to_numpy()
            for i in np.flatnonzero(bad & ~bad_any)[:50]:
                first_problem[int(i)] = problems[int(i)]
            bad_any |= bad
            continue
        bad = value_bad(value, t) if t != "str" else np.zeros(len(raw), bool)
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


def document_pairs(a: np.ndarray, b: np.ndarray) -> tuple[pl.DataFrame, np.ndarray]:
    """The distinct (a, b) pairs of two int columns (ids >= -1) and, per row, the index of its pair."""
    width = int(b.max()) + 2 if len(b) else 1
    distinct, inverse = np.unique((a + 1) * width + (b + 1), return_inverse=True)
    pairs = pl.DataFrame({"a": distinct // width - 1, "b": distinct % width - 1})
    return pairs, inverse.astype(np.int64)


def split_draw(display: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per display id, a fixed function of (id, seed) (splitmix64)."""
    with np.errstate(over="ignore"):
        z = display.astype(np.uint64) + np.uint64((splitmix.GOLDEN * (seed + 1)) & splitmix.MASK)
    splitmix.finalise_numpy(z)
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


BLOCK_ROWS = OutbrainPreprocessConfig.block_rows  # clicks rows per block of the two passes


DAY_MS = 86_400_000


MAX_DAYS = 3650  # days since published: 0 outside 0..MAX_DAYS


REQUEST = ONEHOT[:7]  # from the display's event and its document


ITEM = ("advertiser_id", "campaign_id", "document_id_promo", "source_id_promo", "publisher_id_promo")


PROMO_COLUMN = {"advertiser_id": "advertiser_id", "campaign_id": "campaign_id", "document_id_promo": "document_id"}


def ints(series: pl.Series) -> np.ndarray:
    """An integer column as int64, ``NULL`` where missing."""
    return series.cast(pl.Int64).fill_null(NULL).to_numpy().astype(np.int64, copy=False)
