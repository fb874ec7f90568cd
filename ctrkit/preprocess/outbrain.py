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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.data.atomic import atomic_directory
from ctrkit.data.feature_spec import Feature, FeatureSpec
from ctrkit.data.split_binary import DataError, SplitBinaryWriter
from ctrkit.data.synthetic_outbrain import display_spec
from ctrkit.field_types import ROW_BLOCK
from ctrkit.integrity import vocabulary_fingerprint
from ctrkit.preprocess.outbrain_files import (
    BLOCK_ROWS,
    CTR_MIN_COUNT,
    ITEM,
    KINDS,
    MAX_DAYS,
    MULTI_HOT,
    NULL,
    NULLS,
    NUMERICAL,
    ONEHOT,
    REQUEST,
    SCHEMAS,
    OutbrainRecipe,
    checked,
    find_file,
    page_view_counts,
    read_header,
    require_columns,
    wrong_field_counts,
)
from ctrkit.preprocess.outbrain_tables import Tables, Tally, median_of_counts, standardisation
from ctrkit.preprocess.outbrain_transform import OutbrainTransform, days_since, features
from ctrkit.preprocess.output import Rejects
from ctrkit.preprocess.vocabulary import lookup, positions


def outbrain_spec(cardinalities: dict[str, int], base: Path | None = None, metadata: dict | None = None,
                  raw_ids: tuple[str, ...] = ()) -> FeatureSpec:  # fmt: skip
    spec = display_spec(
        {n: cardinalities[n] for n in ONEHOT}, {n: cardinalities[n] for n in MULTI_HOT}, NUMERICAL, "sum",
        metadata or {}, base,
    )  # fmt: skip
    if not raw_ids:
        return spec
    features = dict(spec.feature_spec)  # raw ids: int64, dynamic, the table's capacity as the cardinality
    for n in raw_ids:
        features[n] = Feature("int64", cardinalities[n], {"dynamic": True})
    return FeatureSpec(features, spec.source_spec, spec.channel_spec, spec.metadata, spec.base_dir)


assert ONEHOT == (*REQUEST, "ad_id", *ITEM)


def _read_clicks(path: Path, display: np.ndarray, rejects: Rejects, block_rows: int, bar) -> tuple:
    """``clicks_train.csv`` streamed: per good row the position of its display among the sorted event
    displays (int32), its ad id (int32 where it fits) and its label; what is held is those 9 bytes a row.
    Bad rows (a value that does not parse or is missing, a label other than 0 and 1, a display not in
    events.csv) go to ``rejects``. Returns (events, ads, labels, rows read)."""
    schema = SCHEMAS["clicks_train"]
    header = read_header(path)
    require_columns(path, header, schema)
    wrong = wrong_field_counts(path, header, rejects)
    scan = pl.scan_csv(path, infer_schema=False, null_values=list(NULLS), truncate_ragged_lines=True)
    scan = scan.select([c for c, _, _ in schema]).with_row_index("line", offset=2)
    if len(wrong):
        scan = scan.filter(~pl.col("line").is_in(pl.Series(wrong, dtype=pl.UInt32).implode()))
    events, ads, labels, read = [], [], [], len(wrong)
    try:
        for batch in scan.collect_batches(chunk_size=block_rows):
            read += len(batch)
            typed, kept = checked(path, batch.drop("line"), schema, rejects, batch["line"])
            lines = batch["line"] if kept is None else batch["line"].filter(pl.Series(kept))
            label = typed["clicked"].to_numpy()  # 0/1: ``checked`` applied the label rule
            ids = typed["display_id"].to_numpy()
            at, found = positions(display, ids)
            orphan = ~found
            if orphan.any():  # clicks rows whose display is not in events.csv
                i = int(np.flatnonzero(orphan)[0])
                if rejects.policy == "error":
                    raise DataError(f"{path}:{int(lines[i])}: display_id {ids[i]} is not in events.csv "
                                    "(set `bad_rows` to skip to drop bad rows)")  # fmt: skip
                rejects.count += int(orphan.sum())
            keep = found
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


@dataclass(frozen=True)
class _Fit:
    """What pass 1 learns from the training rows (what ``OutbrainTransform`` carries, with the tables' lookups): the
    one-hot features' vocabularies, every feature's cardinality, the CTR statistics per fold, the standardisations
    and the median days since publication."""

    vocabs: list[np.ndarray]
    cards: dict[str, int]
    ctr_stats: dict[str, tuple]
    standard: dict[str, tuple]
    medians: dict[str, float]


def _fit(tables: Tables, blocks: Iterable[tuple], recipe: OutbrainRecipe) -> _Fit:
    """Pass 1 over the clicks ``blocks`` (display, ad and label per row): the training rows' vocabularies and
    statistics."""
    folds = recipe.ctr_folds
    counts = [Tally() for _ in ONEHOT]
    ctr_tallies = {name: Tally(weights=1) for name in CTR_MIN_COUNT}
    day_counts = {side: np.zeros(MAX_DAYS + 1, np.int64) for side in ("published", "published_promo")}
    n_train = 0
    for ev, ads, y in blocks:
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
            days = days_since(cols["when"][train], cols[side][train])
            hist += np.bincount(days[days >= 0], minlength=MAX_DAYS + 1)
    onehot_counts = [tally.result() for tally in counts]
    vocabs = [keys[sums[0] >= recipe.frequency_threshold] for keys, sums in onehot_counts]
    cards = {name: len(vocab) + 1 for name, vocab in zip(ONEHOT, vocabs)}
    for name in recipe.raw_ids:  # raw ids: the table's capacity
        cards[name] = max(2, recipe.capacity or cards[name])
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
        standard[f"{name}_count"] = standardisation(np.log1p(total[0].astype(np.float64)), total[0], n_train)
    for name in ("document_id", "document_id_promo"):  # log page views of the document, standardised likewise
        keys, sums = onehot_counts[ONEHOT.index(name)]
        seen = np.log1p(np.maximum(lookup(tables.views_doc, tables.views, keys), 0).astype(np.float64))
        standard[f"{name}_views"] = standardisation(seen, sums[0], n_train)
    medians = {side: median_of_counts(hist) for side, hist in day_counts.items()}

    return _Fit(vocabs, cards, ctr_stats, standard, medians)


def _write(spec: FeatureSpec, tables: Tables, blocks: Iterable[tuple], fit: _Fit, raw_ids: tuple[str, ...]
           ) -> dict[str, int]:  # fmt: skip
    """Pass 2 over the clicks ``blocks``: each block's features (``features``, with what ``fit`` learned) written as
    they are computed, training rows to ``train`` and the others to ``test``, grouped by display (MAP@12); the rows
    of each."""
    written = {"train": 0, "test": 0}
    with SplitBinaryWriter(spec, "train") as train_out, SplitBinaryWriter(spec, "test") as test_out:
        for ev, ads, y in blocks:
            cols = tables.block(ev, ads)
            onehot, numerical, bags = features(cols, tables, fit.vocabs, fit.ctr_stats, fit.standard, fit.medians,
                                               raw_ids)  # fmt: skip
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
    return written


def preprocess_outbrain(
    raw_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    recipe: OutbrainRecipe | None = None,
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
    # one job: the recipe's steps in order (the files checked, the tables, the clicks read, the fit, the rows written,
    # the summary), each a named call
    from ctrkit.progress import tqdm

    started = time.perf_counter()
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise DataError(f"{raw_dir}: not a directory of raw Outbrain files")
    if engine not in ("polars", "spark"):
        raise ValueError(f"`engine`: expected polars or spark, got {engine!r}")
    recipe = recipe if recipe is not None else OutbrainRecipe()
    ROW_BLOCK.check("block_rows", block_rows)
    rejects = Rejects(recipe.bad_rows)
    for name in (*SCHEMAS, "page_views"):  # every file is there before any is read
        find_file(raw_dir, name)
    tables = Tables.load(raw_dir, recipe, rejects)
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
    fit = _fit(tables, blocks("tally"), recipe)

    # pass 2: each block's features, written as they are computed
    meta_info = {"generator": "ctrkit preprocess outbrain", "frequency_threshold": recipe.frequency_threshold,
                 "seed": recipe.seed, "ctr_folds": recipe.ctr_folds,
                 **({"vocabulary_fingerprint": vocabulary_fingerprint(fixed)} if (fixed := {
                     n: v for n, v in zip(ONEHOT, fit.vocabs) if n not in recipe.raw_ids}) else {}),
                 **({"raw_ids": "the files' integer ids as int64; missing: 0"} if recipe.raw_ids else {})}  # fmt: skip
    with atomic_directory(out_dir, overwrite) as tmp:
        spec = outbrain_spec(fit.cards, tmp, meta_info, recipe.raw_ids)
        written = _write(spec, tables, blocks("features"), fit, recipe.raw_ids)
        spec.to_yaml(tmp / "feature_spec.yaml")
        # what the fit learned, for raw rows: the record a model carries (``OutbrainTransform``)
        OutbrainTransform(tables.lookups(), fit.vocabs, fit.ctr_stats, fit.standard, fit.medians,
                          recipe.raw_ids).write(tmp)  # fmt: skip
        seconds = time.perf_counter() - started
        summary = {
            "engine": engine,
            "recipe": "outbrain",
            "rows": written,
            "clicks_rows_read": int(clicks_read),
            "bad_rows": rejects.count,
            "bad_row_examples": rejects.kept,
            "cardinalities": fit.cards,
            "seconds": round(seconds, 3),
            "clicks_rows_per_second": round(clicks_read / max(seconds, 1e-9)),
        }
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
