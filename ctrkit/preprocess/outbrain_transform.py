"""The preprocessing an Outbrain model carries: a display event and an ad, as the raw Kaggle files hold them ->
the Wide & Deep inputs ``ctrkit preprocess outbrain`` wrote for its evaluation rows.

A raw Outbrain row is a row of ``events.csv`` (``document_id``, ``timestamp``, ``platform``, ``geo_location``; its
``display_id`` and ``uuid`` are not read) with the ``ad_id`` of ``clicks_train.csv`` or ``clicks_test.csv``: a
display and one of its candidate ads. ``OutbrainTransform`` holds what the fit learned from the other files and the
training rows, and computes every feature with the code that wrote the dataset (``features``):

* the ``Lookups`` (``outbrain_tables.py``): promoted content by ad, documents' source, publisher and publish time,
  each document's top topics, entities and categories and their tf-idf vectors, page views by document, the geo
  locations' texts;
* the one-hot vocabularies (the training rows' values held ``frequency_threshold`` times; the others and missing
  values are id 0), or, for ``raw_ids`` columns, the ids as they are;
* the CTR statistics (impressions and clicks per value over the training rows), the standardisations of the counts
  and page views, the median days since publication.

A scored row is an evaluation row: its CTRs are over every training row (a training row's leave its own fold out,
which only the fit knows). Its numerical features are rounded to float16, as the dataset stores them, so raw rows
score as ``evaluate`` and ``predict --dataset`` score the dataset's rows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl

from ctrkit.columns import Role
from ctrkit.preprocess.outbrain_files import (
    CTR_MIN_COUNT,
    DAY_MS,
    KINDS,
    MAX_DAYS,
    MULTI_HOT,
    NULL,
    NULLS,
    NUMERICAL,
    ONEHOT,
    REQUEST_SCHEMA,
    TIMESTAMP_EPOCH_MS,
    document_pairs,
    value_bad,
)
from ctrkit.preprocess.outbrain_tables import Lookups, similarity
from ctrkit.preprocess.transform import RECORD_FILE, Column, RawColumns, RowError
from ctrkit.preprocess.values import BadValues
from ctrkit.preprocess.vocabulary import locate, lookup

SOURCE = "ctrkit preprocess outbrain"
FORMAT = 1
TABLES_FILE = "outbrain_tables.npz"  # the arrays beside the record (an export's version, a dataset)
_DTYPES = {"int": "Int64", "str": "String"}


def days_since(when: np.ndarray, published: np.ndarray) -> np.ndarray:
    """Whole days from publication to the event, 0 outside 0..MAX_DAYS, -1 where the publish time is missing."""
    known = published != NULL
    delta = when - np.where(known, published, 0)
    days = np.where(delta >= 0, delta // DAY_MS, 0)
    return np.where(known, np.where(days <= MAX_DAYS, days, 0), -1)


def features(cols: dict, lookups: Lookups, vocabs: Sequence[np.ndarray], ctr_stats: Mapping[str, tuple],
             standard: Mapping[str, tuple[float, float]], medians: Mapping[str, float], raw_ids: Sequence[str] = ()
             ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:  # fmt: skip
    """A block's one-hot ids (n, 13) int32 (int64 with ``raw_ids``: those columns' values as they are, missing 0),
    numerical features (n, 15) float32 and padded multi-hot bags (name -> (n, BAG) int32, -1 past a bag's end),
    from the block's columns (``Lookups.columns``, with ``fold``: a training row's CTR fold, -1 for others) and the
    fit's vocabularies and statistics (``ctr_stats``: name -> (values, (2, values) impressions and clicks, and the
    (2, values, folds) per fold, None where no row trains))."""
    raw = cols["onehot"]
    n = len(raw)
    onehot = np.empty((n, len(ONEHOT)), np.int64 if raw_ids else np.int32)
    for f, vocab in enumerate(vocabs):
        if ONEHOT[f] in raw_ids:
            onehot[:, f] = np.where(raw[:, f] == NULL, 0, raw[:, f])
            continue
        at, found = locate(vocab, raw[:, f])
        onehot[:, f] = np.where(found, at + 1, 0)
    # NaN until put: the writer refuses those, so a feature left unset cannot pass silently
    numerical = np.full((n, len(NUMERICAL)), np.nan, np.float32)

    def put(name: str, values) -> None:
        numerical[:, NUMERICAL.index(name)] = np.asarray(values, dtype=np.float32)

    fold = cols["fold"]
    train = fold >= 0
    for name, minimum in CTR_MIN_COUNT.items():
        distinct, total, per_fold = ctr_stats[name]
        at, found = locate(distinct, raw[:, ONEHOT.index(name)])
        if len(distinct):
            shown = np.where(found, total[0, at], 0)
            clicks = np.where(found, total[1, at], 0)
            shown_seen, clicks_seen = shown, clicks
            if train.any():  # a training row's CTR leaves out its own fold's rows (its display's, its click included)
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
        days = days_since(cols["when"], cols[side]).astype(np.float64)
        put(col, np.log1p(np.where(days < 0, medians[side], days)))
    for name in ("document_id", "document_id_promo"):
        seen = np.maximum(lookup(lookups.views_doc, lookups.views, raw[:, ONEHOT.index(name)]), 0)
        mean, std = standard[f"{name}_views"]
        put(f"{name}_views", (np.log1p(seen.astype(np.float64)) - mean) / std)
    # multi-hot: each document's 3 most confident terms, gathered by document; the similarities are computed
    # once per distinct (page document, ad document) pair
    doc_ids = {"": raw[:, ONEHOT.index("document_id")],
               "_promo": raw[:, ONEHOT.index("document_id_promo")]}  # fmt: skip
    doc_ids = {side: np.where(d == NULL, -1, d) for side, d in doc_ids.items()}
    pairs, pair_of_row = document_pairs(doc_ids[""], doc_ids["_promo"])
    bags = {}
    for kind, plural, _ in KINDS:
        with_bag, padded, _ = lookups.bags[kind]
        for suffix, docs_of_row in doc_ids.items():
            at, found = locate(with_bag, docs_of_row)
            bags[f"{kind}_id_list{suffix}"] = padded[np.where(found, at, len(with_bag))]  # the last row: no terms
        put(f"document_id_document_id_promo_sim_{plural}", similarity(lookups.terms[plural], pairs)[pair_of_row])
    return onehot, numerical, bags


class OutbrainTransform(RawColumns):
    """Raw Outbrain rows (a display event and an ad) -> the model's numerical (B, 15) float32, categorical (B, 13)
    int64 and multi-hot (B, 6, BAG) int64 inputs (-1 padded), as ``preprocess outbrain`` wrote its evaluation rows.

    Args:
        lookups: the tables a row is looked up in (``outbrain_tables.Lookups``).
        vocabs: per one-hot feature (``ONEHOT``'s order) its sorted values with an id of their own (id: 1 + the
            position); a ``raw_ids`` column's is unused.
        ctr_stats: per CTR feature (``CTR_MIN_COUNT``) its training values and their (2, values) impressions and
            clicks.
        standard: per count and page-view feature its training mean and standard deviation.
        medians: per document side the training rows' median days since publication.
        raw_ids: the one-hot columns kept as the files' integer ids.
    """

    source = SOURCE
    label = "clicked"
    file_columns: tuple[str, ...] = ()  # files with a header (``events.csv``'s columns and an ``ad_id``)
    file_separator = ","

    def __init__(self, lookups: Lookups, vocabs: Sequence[np.ndarray], ctr_stats: Mapping[str, tuple],
                 standard: Mapping[str, Sequence[float]], medians: Mapping[str, float],
                 raw_ids: Sequence[str] = ()):  # fmt: skip
        self.lookups = lookups
        self.vocabs = [np.asarray(v, np.int64) for v in vocabs]
        self.ctr_stats = {k: (np.asarray(v[0], np.int64), np.asarray(v[1], np.int64), None)
                          for k, v in ctr_stats.items()}  # fmt: skip
        self.standard = {k: (float(v[0]), float(v[1])) for k, v in standard.items()}
        self.medians = {k: float(v) for k, v in medians.items()}
        self.raw_ids = tuple(raw_ids)
        self.columns = tuple(Column(name, _DTYPES[t], Role.TIME if name == "timestamp" else Role.CATEGORICAL)
                             for name, t, _ in REQUEST_SCHEMA)  # fmt: skip
        self.null_values = tuple(v for v in NULLS if v)
        if len(self.vocabs) != len(ONEHOT) or set(self.ctr_stats) != set(CTR_MIN_COUNT):
            raise ValueError(f"expected {len(ONEHOT)} vocabularies and the CTRs of {', '.join(CTR_MIN_COUNT)}")

    # ---- scoring ----

    def from_request(
        self, values: Mapping[str, Any], rows: int, missing_columns: str = "error", bad: BadValues | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The model's inputs of ``rows`` rows given as ``values`` (column -> a sequence of ``rows`` values;
        columns left out and extra ones as ``check_columns`` says). A bad value (one the fit drops its row for: an id
        or a timestamp that is no integer, a required one missing) is refused, naming its row and column, or scored
        as missing and counted in ``bad``."""
        return self.raw_rows(self._raw_frame(values, rows, missing_columns), bad)

    def raw_rows(self, df: pl.DataFrame, bad: BadValues | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The model's inputs of raw rows as a file holds them (text, or a Parquet file's types)."""
        n = df.height
        ints, bad_rows = {}, []
        for name, kind, required in REQUEST_SCHEMA:
            given = df[name] if name in df.columns else pl.Series(name, [None] * n, dtype=pl.String)
            if given.dtype == pl.String:  # the files' texts for a missing value, in any form of input
                given = given.set(given.is_in(self.null_values), None)
            if kind == "str":
                geo = given.cast(pl.String)
                continue
            if given.dtype.is_float():  # 30.0 is 30; 30.5 is no integer
                given = given.cast(pl.String).str.replace(r"\.0$", "")
            wrong = value_bad(given, kind) | (given.is_null().to_numpy() if required else False)
            typed = given.cast(pl.Int64, strict=False)
            ints[name] = typed.fill_null(NULL).to_numpy().astype(np.int64)
            if wrong.any():
                bad_rows.append((name, wrong, given))
        if bad_rows:
            self._bad(bad_rows, bad)
            for name, wrong, _ in bad_rows:
                ints[name][wrong] = NULL
        when = np.where(ints["timestamp"] == NULL, NULL, ints["timestamp"] + TIMESTAMP_EPOCH_MS)
        cols = self.lookups.columns(ints["document_id"], ints["platform"], self.lookups.geo_codes(geo), when,
                                    ints["ad_id"])  # fmt: skip
        cols["fold"] = np.full(n, -1, np.int64)
        onehot, numerical, bags = features(cols, self.lookups, self.vocabs, self.ctr_stats, self.standard,
                                           self.medians, self.raw_ids)  # fmt: skip
        multi = np.stack([bags[name] for name in MULTI_HOT], axis=1).astype(np.int64) if n else np.full(
            (0, len(MULTI_HOT), 1), -1, np.int64)  # fmt: skip
        return numerical.astype(np.float16).astype(np.float32), onehot.astype(np.int64), multi

    @staticmethod
    def _bad(found: list[tuple[str, np.ndarray, pl.Series]], bad: BadValues | None) -> None:
        """Refuses the first bad value (the earliest row, then the columns' order), or counts them all in ``bad``."""
        name, wrong, given = min(found, key=lambda f: int(np.argmax(f[1])))
        i = int(np.argmax(wrong))
        shown = given[i]
        text = (f"column '{name}' holds {'nothing' if shown is None else repr(str(shown))}; expected an integer"
                f"{' (a value every row needs)' if shown is None else ''}")  # fmt: skip
        if bad is None or bad.rule == "error":
            raise RowError(text, row=i, setting="bad_values")
        bad.add(sum(int(w.sum()) for _, w, _ in found), text, row=i)

    def index_vocabularies(self) -> None:
        """(Nothing to build: the lookups are sorted arrays.)"""

    # ---- what a model checks ----

    def features(self) -> dict[str, list[str]]:
        return {"numerical_features": list(NUMERICAL), "categorical_features": list(ONEHOT),
                "multi_hot_features": list(MULTI_HOT)}  # fmt: skip

    def check_tables(self, num_numerical: int, cardinalities: Sequence[int], multi_hot_cardinalities: Sequence[int],
                     where: str) -> None:  # fmt: skip
        """Raises ValueError when the ids this transform makes do not fit a model's tables (an export's metadata)."""
        ours = [len(v) + 1 for v in self.vocabs]
        bags = [self.lookups.bags[name.split("_id_list")[0]][2] for name in MULTI_HOT]
        fits = (num_numerical == len(NUMERICAL) and len(cardinalities) == len(ONEHOT)
                and all(f in self.raw_ids or o <= c for f, o, c in zip(ONEHOT, ours, cardinalities))
                and list(multi_hot_cardinalities) == bags)  # fmt: skip
        if not fits:
            raise ValueError(f"{where}: the Outbrain preprocessing makes ids the model's tables do not hold: they were "
                             "not exported together")  # fmt: skip

    # ---- stored forms ----

    def description(self) -> dict[str, Any]:
        """Everything but the arrays, as plain values (JSON)."""
        return {
            "format": FORMAT,
            "source": SOURCE,
            "label": self.label,
            "columns": [{"name": c.name, "dtype": c.dtype, "role": c.role.value} for c in self.columns],
            "raw_ids": list(self.raw_ids),
            "standard": {k: list(v) for k, v in self.standard.items()},
            "medians": self.medians,
            "bag_sizes": {kind: int(self.lookups.bags[kind][2]) for kind, _, _ in KINDS},
            "values": int(sum(len(v) for v in self.vocabs)),
        }

    def arrays(self) -> dict[str, np.ndarray]:
        out = {f"lookups/{k}": v for k, v in self.lookups.arrays().items()}
        out.update({f"vocab/{name}": v for name, v in zip(ONEHOT, self.vocabs)})
        for name, (distinct, total, _) in self.ctr_stats.items():
            out[f"ctr/{name}/values"], out[f"ctr/{name}/total"] = distinct, total
        return out

    @classmethod
    def from_parts(cls, doc: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> OutbrainTransform:
        if doc.get("format") != FORMAT or doc.get("source") != SOURCE:
            raise ValueError(f"an Outbrain preprocessing record of format {doc.get('format')!r}; this ctrkit reads "
                             f"{FORMAT}")  # fmt: skip
        lookups = Lookups.from_arrays({k[len("lookups/"):]: v for k, v in arrays.items() if k.startswith("lookups/")},
                                      doc["bag_sizes"])  # fmt: skip
        ctr = {name: (arrays[f"ctr/{name}/values"], arrays[f"ctr/{name}/total"]) for name in CTR_MIN_COUNT}
        return cls(lookups, [arrays[f"vocab/{name}"] for name in ONEHOT], ctr, doc["standard"], doc["medians"],
                   doc.get("raw_ids", ()))  # fmt: skip

    def to_state(self) -> dict[str, Any]:
        """The checkpoint's form: the description and the arrays as tensors."""
        import torch

        return {"description": self.description(),
                "arrays": {k: torch.from_numpy(np.array(v, copy=True)) for k, v in self.arrays().items()}}  # fmt: skip

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> OutbrainTransform:
        return cls.from_parts(state["description"], {k: v.numpy() for k, v in state["arrays"].items()})

    def write(self, directory: Path) -> list[str]:
        """Writes ``preprocessing.json`` and the arrays (``TABLES_FILE``) into ``directory``; returns their names."""
        np.savez(directory / TABLES_FILE, **cast(dict[str, Any], self.arrays()))  # (numpy's stub: any kwarg a bool)
        (directory / RECORD_FILE).write_text(json.dumps(self.description(), indent=2) + "\n")
        return [RECORD_FILE, TABLES_FILE]

    @classmethod
    def read(cls, directory: str | os.PathLike) -> OutbrainTransform:
        """The transform ``write`` wrote into ``directory``."""
        directory = Path(directory)
        try:
            doc = json.loads((directory / RECORD_FILE).read_text(encoding="utf-8"))
            with np.load(directory / TABLES_FILE, allow_pickle=False) as arrays:
                return cls.from_parts(doc, dict(arrays))
        except (OSError, ValueError, KeyError, TypeError) as e:
            problem = f"{type(e).__name__}: {e}"
            raise ValueError(f"{directory}: Outbrain preprocessing record unreadable ({problem})") from None
