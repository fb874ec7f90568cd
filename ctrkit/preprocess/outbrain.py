"""``ctrkit preprocess outbrain``: the raw Kaggle Outbrain Click Prediction files -> a Wide & Deep dataset.

The feature set follows NVIDIA's Wide & Deep workflow (read to learn its definitions; see the README
for where this differs):

- request level, one-hot: the display's document, its source and publisher, the platform, the geo
  location and its country (first 2 characters) and state (first 5);
- item level, one-hot: ad, advertiser, campaign, the ad's document and its source and publisher;
- multi-hot: the topics, entities and categories of the display's document and of the ad's document,
  each the 3 of highest confidence;
- numerical: the CTR of ad, advertiser, campaign, ad document, ad source and ad publisher over the
  training rows (0 below a minimum count: 5 for ad and ad document, 10 for the others); a training row's
  over the training rows of the other ``ctr_folds`` folds (whole displays; NVIDIA's count the row's own
  label, and leaving only the row out gives it away: see the README), the training
  impressions of the ad and of the ad document (log, standardised), the days since each document was
  published (log; missing: the training median), the tf-idf cosine similarity of the two documents'
  categories, topics and entities, and the page views of each document in ``page_views.csv`` (log,
  standardised; the file is streamed, never held).

Split (as NVIDIA's): per display, a random 80% of the displays of days 0-10 train; the other 20% of
those days and every display of later days form the evaluation set (``test``, ordered by display,
with the display id as the ``map`` channel for MAP@12). Vocabularies and statistics come from the
training rows only. Ids seen fewer than ``frequency_threshold`` times in training, and missing
values, map to id 0.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

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
    """The file's columns cast to their types; rows with a value that does not parse, or a required value
    missing, go to ``rejects`` (line numbers count the header as line 1)."""
    casts = {"int": pl.Int64, "float": pl.Float64, "str": pl.Utf8}
    try:  # the fast path: every value parses (then only required columns need a look)
        header = pl.read_csv(path, n_rows=0, infer_schema=False).columns
        names = {c for c, _, _ in schema}
        typed = pl.read_csv(
            path, schema_overrides={c: casts[t] for c, t, _ in schema}, null_values=list(NULLS),
            columns=[c for c in header if c in names],
        ).select([c for c, _, _ in schema])  # fmt: skip
        if not any(typed[c].null_count() for c, _, required in schema if required):
            return typed
    except Exception:  # a value that does not parse, a missing column, a ragged row: found below
        pass
    try:
        raw = pl.read_csv(path, infer_schema=False, null_values=list(NULLS))
    except Exception as e:  # ragged rows, bad quoting, not a CSV
        raise DataError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    missing = [c for c, _, _ in schema if c not in raw.columns]
    if missing:
        raise DataError(f"{path}: lacks the columns {missing} (header: {raw.columns})")
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
        kept = [(int(i) + 2, first_problem.get(int(i), "bad value"), ",".join(
            "" if v is None else str(v) for v in raw.row(int(i)))) for i in rows[:50]]  # fmt: skip
        rejects.add(str(path), kept)
        rejects.count += len(rows) - len(kept)
        typed = typed.filter(pl.Series(~bad_any))
    return typed


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


def _positions(keys: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The position of each query in the sorted, distinct ``keys``, and whether it is there. Ids of raw
    Outbrain columns are small non-negative integers, so a table indexed by id answers directly; other keys
    go through a binary search."""
    top = int(keys[-1]) if len(keys) else -1
    if len(keys) and keys[0] >= 0 and top < max(1 << 22, 2 * len(queries)):
        table = np.full(top + 2, -1, np.int64)  # the last entry: every query out of range
        table[keys] = np.arange(len(keys))
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


def _similarity(docs: pl.DataFrame, pairs: pl.DataFrame, n_docs: int) -> np.ndarray:
    """tf-idf cosine similarity of (document_id, document_id_promo) ``pairs`` over one kind of term."""
    df = docs.group_by("vid").agg(pl.len().alias("df"))
    weighted = docs.join(df, on="vid").with_columns(
        (pl.col("confidence_level") * (np.log(max(n_docs, 1)) - pl.col("df").log())).alias("w")
    )
    norms = weighted.group_by("document_id").agg((pl.col("w") ** 2).sum().sqrt().alias("norm"))
    weighted = weighted.join(norms, on="document_id").with_columns((pl.col("w") / pl.col("norm")).alias("u"))
    terms = weighted.select("document_id", "vid", "u")
    unique = pairs.unique()  # missing documents are -1: no terms, similarity 0
    dots = (
        unique.join(terms.rename({"document_id": "a", "u": "ua"}), on="a")
        .join(terms.rename({"document_id": "b", "u": "ub"}), on=["b", "vid"])
        .group_by(["a", "b"])
        .agg((pl.col("ua") * pl.col("ub")).sum().alias("sim"))
    )
    out = pairs.join(dots, on=["a", "b"], how="left", maintain_order="left")["sim"].fill_null(0.0).fill_nan(0.0)
    return out.to_numpy().astype(np.float32)


def outbrain_spec(cardinalities: dict[str, int], base: Path | None = None, metadata: dict | None = None) -> FeatureSpec:
    return display_spec(
        {n: cardinalities[n] for n in ONEHOT}, {n: cardinalities[n] for n in MULTI_HOT}, NUMERICAL, "sum",
        metadata or {}, base,
    )  # fmt: skip


def preprocess_outbrain(
    raw_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    recipe: OutbrainRecipe = OutbrainRecipe(),
    overwrite: bool = False,
    progress: bool = True,
    engine: str = "polars",
    master: str = "local[*]",
) -> dict:
    """Runs the recipe; returns the summary also written to ``summary.json``.

    ``engine`` "spark" counts ``page_views.csv`` (the real data's 2 billion rows) on Spark (``master``);
    the other files, at most the clicks' rows, are read and joined here with the same code, so both
    engines write byte-identical datasets."""
    from tqdm.auto import tqdm

    started = time.perf_counter()
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise DataError(f"{raw_dir}: not a directory of raw Outbrain files")
    if engine not in ("polars", "spark"):
        raise ValueError(f"`engine`: expected polars or spark, got {engine!r}")
    if recipe.frequency_threshold < 1:
        raise ValueError(f"`frequency_threshold`: expected an integer >= 1, got {recipe.frequency_threshold}")
    rejects = Rejects(recipe.bad_rows)
    steps = tqdm(total=6, desc="preprocess outbrain", unit="step", disable=not progress)
    t = {name: read_checked(find_file(raw_dir, name), schema, rejects) for name, schema in SCHEMAS.items()}
    steps.update(1)
    if engine == "spark":
        from ctrkit.preprocess.spark_engine import page_view_counts_spark, start_session

        views = page_view_counts_spark(find_file(raw_dir, "page_views"), rejects, start_session(master))
    else:
        views = page_view_counts(find_file(raw_dir, "page_views"), rejects)
    steps.update(1)

    clicks = t.pop("clicks_train").with_row_index("row")  # the raw frames are freed as soon as they are used
    clicks_read = len(clicks)
    bad_label = clicks.filter(~pl.col("clicked").is_in([0, 1]))
    if len(bad_label):
        rejects.add(
            str(find_file(raw_dir, "clicks_train")),
            [(int(bad_label["row"][0]) + 2, f"clicked: expected 0 or 1, got {bad_label['clicked'][0]}", "")],
        )
        clicks = clicks.filter(pl.col("clicked").is_in([0, 1]))  # fmt: skip
    events = t.pop("events").unique("display_id", keep="first", maintain_order=True)
    promo = (
        t.pop("promoted_content")
        .unique("ad_id", keep="first", maintain_order=True)
        .rename({"document_id": "document_id_promo"})
    )
    meta = (
        t.pop("documents_meta")
        .unique("document_id", keep="first", maintain_order=True)
        .with_columns(pl.col("publish_time").str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False).alias("published"))
    )
    rows = (
        clicks.join(events, on="display_id", how="inner", maintain_order="left")
        .join(promo, on="ad_id", how="left", maintain_order="left")
        .join(meta.select("document_id", "source_id", "publisher_id", "published"), on="document_id", how="left",
              maintain_order="left")
        .join(meta.select(pl.col("document_id").alias("document_id_promo"),
                          pl.col("source_id").alias("source_id_promo"),
                          pl.col("publisher_id").alias("publisher_id_promo"),
                          pl.col("published").alias("published_promo")),
              on="document_id_promo", how="left", maintain_order="left")
    )  # fmt: skip
    orphans = len(clicks) - len(rows)
    if orphans:  # clicks rows whose display is not in events.csv
        if recipe.bad_rows == "error":
            missing = clicks.join(events, on="display_id", how="anti", maintain_order="left")
            raise DataError(
                f"{find_file(raw_dir, 'clicks_train')}:{int(missing['row'][0]) + 2}: display_id "
                f"{missing['display_id'][0]} is not in events.csv (set `bad_rows` to skip to drop bad rows)"
            )
        rejects.count += orphans
    del clicks, events, promo, meta
    geo = pl.col("geo_location")
    rows = rows.with_columns(
        geo.str.slice(0, 2).alias("geo_location_country"),
        geo.str.slice(0, 5).alias("geo_location_state"),
        (pl.col("timestamp") // 86_400_000).alias("day"),
        (pl.col("timestamp") + TIMESTAMP_EPOCH_MS).cast(pl.Datetime("ms")).alias("when"),
    )
    draw = _split_draw(rows["display_id"].to_numpy(), recipe.seed)
    is_train = (rows["day"].to_numpy() <= TRAIN_LAST_DAY) & (draw >= EVAL_SHARE)
    needed = {*ONEHOT, *CTR_MIN_COUNT, "clicked", "display_id", "when", "published", "published_promo"}
    rows = rows.select([c for c in rows.columns if c in needed]).with_columns(pl.Series("is_train", is_train))
    steps.update(1)

    # vocabularies of the one-hot features: training rows, ids seen at least `frequency_threshold` times
    cards = {}
    # the numerical features, each converted to float32 as it is computed (as they are stored, then as
    # float16): no column is held in float64 beside the others (NaN until put: the writer refuses those)
    numerical = np.full((len(rows), len(NUMERICAL)), np.nan, np.float32)

    def put(name: str, values) -> None:
        numerical[:, NUMERICAL.index(name)] = np.asarray(values, dtype=np.float32)

    train_rows = rows.filter(pl.col("is_train")).select(*ONEHOT, "clicked")
    onehot = np.empty((len(rows), len(ONEHOT)), np.int32)
    for f, name in enumerate(ONEHOT):
        vocab = (
            train_rows.group_by(name).agg(pl.len().alias("n")).filter(pl.col(name).is_not_null()
            & (pl.col("n") >= recipe.frequency_threshold)).sort(name)[name]
        )  # fmt: skip
        onehot[:, f] = _vocabulary_ids(rows[name], vocab)
        cards[name] = len(vocab) + 1
    # the one-hot ids are in `onehot` now: only the columns the later steps read are kept (the request's
    # strings and ids, and the training rows' copy of them, are freed)
    rows = rows.select(*CTR_MIN_COUNT, "document_id", "clicked", "display_id", "when", "published", "published_promo")
    train_rows = train_rows.select(*CTR_MIN_COUNT, "clicked")
    # multi-hot: each document's 3 most confident topics / entities / categories (vocabulary: all of them),
    # gathered to the rows by document; the similarities are computed once per distinct (page document,
    # ad document) pair
    doc_ids = {side: rows[col].fill_null(-1).to_numpy().astype(np.int64)
               for side, col in (("", "document_id"), ("_promo", "document_id_promo"))}  # fmt: skip
    pairs, pair_of_row = _pairs(doc_ids[""], doc_ids["_promo"])
    bags = {}
    for kind, plural, id_col in KINDS:
        docs = t[f"documents_{plural}"].unique(["document_id", id_col], keep="first", maintain_order=True)
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
        for suffix, docs_of_row in doc_ids.items():
            at, found = _positions(with_bag, docs_of_row)
            mine = padded[np.where(found, at, len(lists))]  # (N, BAG), -1 past each bag's end
            keep = mine >= 0
            bags[f"{kind}_id_list{suffix}"] = (mine[keep], keep.sum(axis=1, dtype=np.int32))
            cards[f"{kind}_id_list{suffix}"] = len(vocab) + 1
        n_docs = docs["document_id"].n_unique()
        sims = _similarity(docs, pairs, n_docs)
        put(f"document_id_document_id_promo_sim_{plural}", sims[pair_of_row])
    steps.update(1)

    # numerical features from training rows only
    # a training row's CTR comes from the training rows of the other folds (folds: whole displays, a fixed
    # function of the split draw), so no training row's feature counts its own label or its display's
    folds = recipe.ctr_folds
    fold = np.where(is_train, np.minimum(((draw - EVAL_SHARE) / (1 - EVAL_SHARE) * folds).astype(np.int64),
                                         folds - 1), -1)  # fmt: skip
    rows = rows.with_columns(pl.Series("fold", fold))
    train_rows = train_rows.with_columns(pl.Series("fold", fold[is_train]))
    for name, minimum in CTR_MIN_COUNT.items():
        per_fold = train_rows.group_by(name, "fold").agg(pl.col("clicked").sum().alias("cf"), pl.len().alias("nf"))
        stats = per_fold.group_by(name).agg(pl.col("cf").sum().alias("c"), pl.col("nf").sum().alias("n"))
        joined = (
            rows.select(name, "fold")
            .join(stats, on=name, how="left", maintain_order="left")
            .join(per_fold, on=[name, "fold"], how="left", maintain_order="left")
        )  # evaluation rows (fold -1) match no fold: they see every training row
        clicks_seen = pl.col("c") - pl.col("cf").fill_null(0)
        seen = pl.col("n") - pl.col("nf").fill_null(0)
        ctr = joined.select(
            pl.when(seen >= minimum).then(clicks_seen / seen).otherwise(0.0).fill_null(0.0).alias("ctr")
        )["ctr"]
        put(f"{name}_ctr", ctr)
        if name in ("ad_id", "document_id_promo"):
            put(f"{name}_count", _standardised(np.log1p(joined["n"].fill_null(0).to_numpy()), is_train))
    for col, when in (("publish_time_days_since_published", "published"),
                      ("publish_time_promo_days_since_published", "published_promo")):  # fmt: skip
        days = rows.select(((pl.col("when") - pl.col(when)).dt.total_days()).alias("d"))["d"]
        days = days.to_numpy().astype(np.float64)  # NaN where the publish time is missing
        days = np.where(np.isnan(days), np.nan, np.where((days >= 0) & (days <= 3650), days, 0.0))
        median = float(np.nanmedian(days[is_train])) if np.isfinite(days[is_train]).any() else 0.0
        put(col, np.log1p(np.where(np.isnan(days), median, days)))
    for doc_col in ("document_id", "document_id_promo"):
        n = rows.select(doc_col).join(views, left_on=doc_col, right_on="document_id", how="left",
                                      maintain_order="left")["views"].fill_null(0)  # fmt: skip
        put(f"{doc_col}_views", _standardised(np.log1p(n.to_numpy()), is_train))
    steps.update(1)

    labels = rows["clicked"].to_numpy().astype(np.uint8)
    display = rows["display_id"].to_numpy()
    del rows, train_rows, t  # the output arrays are all that is left
    meta_info = {"generator": "ctrkit preprocess outbrain", "frequency_threshold": recipe.frequency_threshold,
                 "seed": recipe.seed, "ctr_folds": recipe.ctr_folds}  # fmt: skip
    counts = {}
    with atomic_directory(out_dir, overwrite) as tmp:
        spec = outbrain_spec(cards, tmp, meta_info)
        for mapping, mask in (("train", is_train), ("test", ~is_train)):
            idx = np.flatnonzero(mask)
            if mapping == "test":  # evaluation rows grouped by display (MAP@12)
                idx = idx[np.argsort(display[idx], kind="stable")]
            with SplitBinaryWriter(spec, mapping) as writer:
                multi = []
                for name in MULTI_HOT:
                    values, lengths = bags[name]
                    multi.append((values[_bag_positions(lengths, idx)], lengths[idx]))
                writer.append(numerical[idx], onehot[idx], labels[idx], multi,
                              display[idx] if mapping == "test" else None)  # fmt: skip
            counts[mapping] = int(len(idx))
        spec.to_yaml(tmp / "feature_spec.yaml")
        seconds = time.perf_counter() - started
        summary = {
            "engine": engine,
            "recipe": "outbrain",
            "rows": counts,
            "clicks_rows_read": int(clicks_read),
            "bad_rows": rejects.count,
            "bad_row_examples": rejects.kept,
            "cardinalities": cards,
            "seconds": round(seconds, 3),
            "clicks_rows_per_second": round(clicks_read / max(seconds, 1e-9)),
        }
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    steps.update(1)
    steps.close()
    return summary


def _standardised(x: np.ndarray, is_train: np.ndarray) -> np.ndarray:
    mean, std = (
        float(x[is_train].mean()) if is_train.any() else 0.0,
        float(x[is_train].std()) if is_train.any() else 1.0,
    )
    return (x - mean) / (std if std > 0 else 1.0)


def _bag_positions(lengths: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Positions in the flat values of the bags of rows ``idx`` (bags stored back to back by ``lengths``)."""
    starts = np.cumsum(lengths) - lengths
    picked = lengths[idx]
    out_starts = np.cumsum(picked) - picked
    return np.arange(int(picked.sum())) - np.repeat(out_starts, picked) + np.repeat(starts[idx], picked)
