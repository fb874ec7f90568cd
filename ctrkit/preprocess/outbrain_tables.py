"""The tables the Outbrain features are computed from: the documents' tf-idf term rows and their cosine similarity,
the training rows' tallies (CTRs, counts, medians), and every small file held as arrays (``Tables``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.preprocess.outbrain_files import (
    BAG,
    DAY_MS,
    EVAL_SHARE,
    ITEM,
    KINDS,
    NULL,
    PROMO_COLUMN,
    SCHEMAS,
    TIMESTAMP_EPOCH_MS,
    TRAIN_LAST_DAY,
    OutbrainRecipe,
    find_file,
    ints,
    read_checked,
    split_draw,
)
from ctrkit.preprocess.output import Rejects
from ctrkit.preprocess.transform import strings, utf8
from ctrkit.preprocess.vocabulary import codes, dense_table, locate, lookup, positions, sorted_ids


def doc_lists(docs: pl.DataFrame, id_col: str) -> pl.DataFrame:
    """document_id -> the (vocabulary) ids of its ``BAG`` highest-confidence values, as a list."""
    return (
        docs.sort(["document_id", "confidence_level", "vid"], descending=[False, True, False])
        .group_by("document_id", maintain_order=True)
        .agg(pl.col("vid").head(BAG).alias("ids"))
    )


def term_weights(docs: pl.DataFrame) -> pl.DataFrame:
    """Each document's unit-length tf-idf vector over one kind of term: (document_id, vid, u), sorted."""
    n_docs = max(docs["document_id"].n_unique(), 1)
    df = docs.group_by("vid").agg(pl.len().alias("df"))
    weighted = docs.join(df, on="vid").with_columns(
        (pl.col("confidence_level") * (np.log(n_docs) - pl.col("df").log())).alias("w")
    )
    norms = weighted.group_by("document_id").agg((pl.col("w") ** 2).sum().sqrt().alias("norm"))
    weighted = weighted.join(norms, on="document_id").with_columns((pl.col("w") / pl.col("norm")).alias("u"))
    return weighted.select("document_id", "vid", "u").sort("document_id", "vid")


class TermRows:
    """A term table sorted by document_id (``term_weights``) and, for each of its documents, where its rows
    start and end: any set of documents' rows are then taken without searching the whole table."""

    def __init__(self, frame: pl.DataFrame):
        self.frame = frame
        column = frame["document_id"].to_numpy()
        starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]]) if len(column) else np.zeros(0, np.int64)
        self.docs = column[starts].astype(np.int64)  # distinct, ascending
        self.bounds = np.append(starts, len(column))  # document k's rows: bounds[k] .. bounds[k + 1] - 1
        # raw Outbrain document ids are small non-negative integers: a position per id, built once
        self.dense = dense_table(self.docs, max(1 << 22, 4 * len(self.docs)))

    def of(self, docs: np.ndarray) -> pl.DataFrame:
        """The rows of ``docs`` (distinct ids, -1 or absent ones have none), in table order."""
        at, found = positions(self.docs, docs, self.dense)
        lo = np.where(found, self.bounds[at], 0)
        lengths = np.where(found, self.bounds[np.minimum(at + 1, len(self.docs))] - lo, 0)
        # the row numbers lo[i] .. lo[i] + lengths[i] - 1 of every document, concatenated
        starts = np.repeat(lo - np.cumsum(lengths) + lengths, lengths)
        return self.frame[starts + np.arange(int(lengths.sum()))]


def similarity(terms: TermRows, pairs: pl.DataFrame) -> np.ndarray:
    """tf-idf cosine similarity of (document_id, document_id_promo) ``pairs`` (columns a, b) over one kind of
    term (``term_weights``). Each pair's products are summed in term order, so a pair's value does not depend
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


class Tally:
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


def standardisation(values: np.ndarray, counts: np.ndarray, total: int) -> tuple[float, float]:
    """Mean and standard deviation over ``total`` training rows of which ``counts`` hold each of ``values``
    and the rest 0."""
    if total <= 0:
        return 0.0, 1.0
    mean = float(np.dot(counts, values)) / total
    spread = float(np.dot(counts, (values - mean) ** 2)) + (total - int(counts.sum())) * mean**2
    std = (spread / total) ** 0.5
    return mean, std if std > 0 else 1.0


def median_of_counts(counts: np.ndarray) -> float:
    """The median of the integers 0..len-1 seen ``counts`` times (0 when none)."""
    n = int(counts.sum())
    if not n:
        return 0.0
    ends = np.cumsum(counts)
    lo, hi = np.searchsorted(ends, (n - 1) // 2, side="right"), np.searchsorted(ends, n // 2, side="right")
    return (float(lo) + float(hi)) / 2


@dataclass
class Lookups:
    """What a display event and an ad are looked up in: promoted content by ad, documents by id, per kind of document
    term the bags and tf-idf vectors, page views by document, and the geo locations' texts. Their size follows the
    documents and ads, not the clicks rows; the fitted Outbrain preprocessing carries them
    (``outbrain_transform.OutbrainTransform``)."""

    geo_names: tuple[pl.Series, ...]  # the sorted texts the codes of geo, country and state stand for
    promo_ad: np.ndarray  # promoted content, sorted by ad_id
    promo: dict[str, np.ndarray]
    meta_doc: np.ndarray  # documents, sorted by document_id
    meta: dict[str, np.ndarray]  # source_id, publisher_id, published (ms since 1970)
    bags: dict[str, tuple[np.ndarray, np.ndarray, int]]  # kind -> documents with terms, padded bags, vocabulary
    terms: dict[str, TermRows]  # plural -> term_weights' table
    views_doc: np.ndarray
    views: np.ndarray

    def columns(self, doc: np.ndarray, platform: np.ndarray, geo: Sequence[np.ndarray], when: np.ndarray,
                ad: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
        """The columns of display events (the page's document, platform, the codes of the geo location, its country
        and its state, the time in ms since 1970) each with an ad, ``NULL`` where missing: the 13 one-hot features'
        raw values (n, 13) int64 (``NULL`` for missing), the event time and the two documents' publish times."""
        page = locate(self.meta_doc, doc)  # the page's document's row of documents_meta (looked up once)
        item = locate(self.promo_ad, ad)  # the ad's row of promoted_content

        def of(columns: dict, name: str, where: tuple) -> np.ndarray:
            at, found = where
            return np.where(found, columns[name][at], NULL) if found.any() else np.full(len(at), NULL, np.int64)

        def of_page(name):
            return of(self.meta, name, page)

        def of_ad(name):
            return of(self.promo, name, item)

        values = np.stack([doc, of_page("source_id"), of_page("publisher_id"), platform, *geo,
                           ad, *(of_ad(name) for name in ITEM)], axis=1)  # fmt: skip
        return {"onehot": values, "when": when, "published": of_page("published"),
                "published_promo": of_ad("published_promo")}  # fmt: skip

    def geo_codes(self, text: pl.Series) -> list[np.ndarray]:
        """The codes of geo locations given as text (``NULL`` where missing or a text the events never held): the
        location's, its country's (first 2 characters) and its state's (first 5), as the events' were coded."""
        out = []
        for width, names in zip((None, 2, 5), self.geo_names):
            part = text if width is None else text.str.slice(0, width)
            ids = sorted_ids(part, names).astype(np.int64)
            out.append(np.where(ids > 0, ids - 1, NULL))
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """Every table as named arrays (texts as their UTF-8 bytes and offsets): ``from_arrays`` reads them back."""
        out = {"promo_ad": self.promo_ad, "meta_doc": self.meta_doc, "views_doc": self.views_doc, "views": self.views}
        out.update({f"promo/{k}": v for k, v in self.promo.items()})
        out.update({f"meta/{k}": v for k, v in self.meta.items()})
        for k, (docs, padded, _) in self.bags.items():
            out[f"bags/{k}/docs"], out[f"bags/{k}/padded"] = docs, padded
        for k, rows in self.terms.items():
            out.update({f"terms/{k}/{c}": rows.frame[c].to_numpy() for c in rows.frame.columns})
        for k, names in enumerate(self.geo_names):
            out[f"geo/{k}/bytes"], out[f"geo/{k}/offsets"] = utf8(names.cast(pl.String))
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], bag_sizes: dict[str, int]) -> Lookups:
        """The tables ``arrays`` wrote (``bag_sizes``: each kind's vocabulary size, the bags' third member)."""

        def under(prefix: str) -> dict[str, np.ndarray]:
            return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}

        geo = [strings(arrays[f"geo/{k}/bytes"], arrays[f"geo/{k}/offsets"]) for k in range(3)]
        bags = {kind: (arrays[f"bags/{kind}/docs"], arrays[f"bags/{kind}/padded"], int(bag_sizes[kind]))
                for kind, _, _ in KINDS}  # fmt: skip
        terms = {plural: TermRows(pl.DataFrame({c: arrays[f"terms/{plural}/{c}"] for c in ("document_id", "vid", "u")}))
                 for _, plural, _ in KINDS}  # fmt: skip
        return cls(tuple(geo), arrays["promo_ad"], under("promo/"), arrays["meta_doc"], under("meta/"), bags, terms,
                   arrays["views_doc"], arrays["views"])  # fmt: skip


@dataclass
class Tables(Lookups):
    """The files other than clicks and page views, as sorted keys and columns for lookups: the ``Lookups`` and the
    events by display. Their size follows the events and documents, not the clicks rows."""

    display: np.ndarray  # events, sorted by display_id
    ev_doc: np.ndarray
    ev_when: np.ndarray  # ms since 1970
    ev_platform: np.ndarray
    ev_geo: np.ndarray  # codes of geo_location
    ev_fold: np.ndarray  # int8: the CTR fold of a training display, -1 for an evaluation one
    geo_parts: np.ndarray  # per geo code: its code, its country's and its state's (3, codes)

    def lookups(self) -> Lookups:
        """The tables without the events."""
        return Lookups(**{f.name: getattr(self, f.name) for f in fields(Lookups)})

    @classmethod
    def load(cls, raw_dir: Path, recipe: OutbrainRecipe, rejects: Rejects) -> Tables:
        """The tables, without the page views (``with_views``)."""
        t = {name: read_checked(find_file(raw_dir, name), SCHEMAS[name], rejects)
             for name in SCHEMAS if name != "clicks_train"}  # fmt: skip
        events = t.pop("events").unique("display_id", keep="first", maintain_order=True).sort("display_id")
        display = events["display_id"].to_numpy().astype(np.int64)
        stamp = events["timestamp"].to_numpy().astype(np.int64)
        draw = split_draw(display, recipe.seed)
        train = (stamp // DAY_MS <= TRAIN_LAST_DAY) & (draw >= EVAL_SHARE)
        # a training display's fold: a fixed function of its draw (whole displays per fold)
        folds = recipe.ctr_folds
        fold = np.minimum(((draw - EVAL_SHARE) / (1 - EVAL_SHARE) * folds).astype(np.int64), folds - 1)
        geo, geo_names = codes(events["geo_location"])
        parts, names = [np.arange(len(geo_names), dtype=np.int64)], [geo_names]
        for width in (2, 5):  # country, state: the first characters, coded in their own sorted order
            code, name = codes(geo_names.str.slice(0, width))
            parts.append(code)
            names.append(name)
        tables = dict(
            display=display, ev_doc=ints(events["document_id"]), ev_when=stamp + TIMESTAMP_EPOCH_MS,
            ev_platform=ints(events["platform"]), ev_geo=geo,
            ev_fold=np.where(train, fold, -1).astype(np.int8), geo_parts=np.stack(parts), geo_names=tuple(names),
        )  # fmt: skip
        del events, stamp, draw, train, fold
        meta = t.pop("documents_meta").unique("document_id", keep="first", maintain_order=True).sort("document_id")
        published = meta["publish_time"].str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False).dt.epoch("ms")
        tables["meta_doc"] = meta["document_id"].to_numpy().astype(np.int64)
        tables["meta"] = {"source_id": ints(meta["source_id"]), "publisher_id": ints(meta["publisher_id"]),
                          "published": ints(published)}  # fmt: skip
        del meta, published
        promo = t.pop("promoted_content").unique("ad_id", keep="first", maintain_order=True).sort("ad_id")
        tables["promo_ad"] = promo["ad_id"].to_numpy().astype(np.int64)
        columns = {name: ints(promo[col]) for name, col in PROMO_COLUMN.items()}
        for name in ("source_id", "publisher_id", "published"):  # the ad's document's, looked up once per ad
            columns[f"{name}_promo"] = lookup(tables["meta_doc"], tables["meta"][name], columns["document_id_promo"])
        tables["promo"] = columns
        del promo
        tables["bags"], tables["terms"] = {}, {}
        for kind, plural, id_col in KINDS:
            docs = t.pop(f"documents_{plural}").unique(["document_id", id_col], keep="first", maintain_order=True)
            vocab = docs.select(id_col).unique().sort(id_col).with_row_index("vid", offset=1)
            docs = docs.join(vocab, on=id_col, maintain_order="left").select(
                "document_id", pl.col("vid").cast(pl.Int64), "confidence_level"
            )
            lists = doc_lists(docs, id_col)
            with_bag = lists["document_id"].to_numpy().astype(np.int64)  # sorted (group_by kept the sort order)
            lengths = lists["ids"].list.len().to_numpy().astype(np.int64)
            flat = lists["ids"].explode().to_numpy().astype(np.int32)
            padded = np.full((len(lists) + 1, BAG), -1, np.int32)  # the last row: documents without any
            within = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            padded[np.repeat(np.arange(len(lists)), lengths), within] = flat
            tables["bags"][kind] = (with_bag, padded, len(vocab) + 1)
            tables["terms"][plural] = TermRows(term_weights(docs))
        return cls(**tables, views_doc=np.zeros(0, np.int64), views=np.zeros(0, np.int64))

    def with_views(self, views: pl.DataFrame) -> None:
        """Page views per document (``page_view_counts``)."""
        views = views.sort("document_id")
        self.views_doc = views["document_id"].to_numpy().astype(np.int64)
        self.views = views["views"].to_numpy().astype(np.int64)

    def block(self, event: np.ndarray, ad: np.ndarray) -> dict[str, np.ndarray]:
        """The columns of a block of clicks rows (their events' positions, their ads): ``columns`` of their events'
        values, with the rows' fold and display."""
        geo = self.ev_geo[event]
        known = geo != NULL
        geo_part = [np.where(known, part[np.where(known, geo, 0)], NULL) if len(part) else geo
                    for part in self.geo_parts]  # fmt: skip
        cols = self.columns(self.ev_doc[event], self.ev_platform[event], geo_part, self.ev_when[event], ad)
        return {**cols, "fold": self.ev_fold[event].astype(np.int64), "display": self.display[event]}
