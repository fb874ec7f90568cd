"""The rows of ``preprocess table`` and the work done on them, in an engine: ``PolarsRows`` holds the table in this
process's memory; ``table_spark.SparkRows`` keeps it in Apache Spark's parts. Both run the same steps, in the same
order, through the same functions of one frame of rows (this module's), so that both write the same dataset:

1. ``read``: every file read by ``table_reader``'s rules (``read_file``), the types merged over the files
   (``merged_schema``: train and test files are one table), a model's types applied for ``--like``;
2. ``facts``: what the roles read of a column's training values (``ColumnFacts``);
3. ``clean``: the bad rows found (``clean_frame``), the label made 0/1, the rows ordered (the files' order, or
   sorted by a column, stable, or shuffled; train rows before test rows);
4. ``counts``: each feature's texts counted over the fitting rows (``feature_texts``), for its vocabulary;
5. ``encode``: the fitted ``RowTransform`` applied to every row (its ``encode``, the only code that writes ids);
6. ``test_inputs`` and ``blocks``: what the value-id test (rows ``lo``..``hi``) and the dataset writer read, in
   row order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.preprocess.output import Rejects
from ctrkit.preprocess.table_reader import read_table
from ctrkit.preprocess.table_recipe import FILE_COL, LINE_COL, RAW_PREFIX, ColumnFacts, Roles, TableRecipe
from ctrkit.preprocess.transform import RowError, RowTransform, category_text, multi_hot_lists

LABEL, PROBLEM = "__label", "__problem"  # a clean row's 0/1 label; a row's problem (null where fine)
WRITE_ROWS = 1 << 18  # rows per block written


@dataclass(frozen=True)
class Block:
    """Rows [lo, hi) of the encoded table, as the dataset stores them: numerical (None without numerical
    features), one id array per categorical feature, per multi-hot feature its flat ids and values a row, labels,
    and group ids (None without a group column)."""

    lo: int
    hi: int
    numerical: np.ndarray | None
    ids: list[np.ndarray]
    multi_hot: list[tuple[np.ndarray, np.ndarray]]
    labels: np.ndarray
    groups: np.ndarray | None


@dataclass(frozen=True)
class Steps:
    """What ``clean`` does to each row: its problem (null where fine), its 0/1 label, the columns added (the
    numerical candidates of ``--also-categorical auto`` as Float64) and the row order."""

    problem: pl.Expr
    label: pl.Expr
    added: tuple[pl.Expr, ...]
    order_by: str | None
    shuffle_seed: int | None


def read_file(path: Path, recipe: TableRecipe, file_index: int) -> pl.DataFrame:
    """One input file (``table_reader``'s rules), with the file index and the line (CSV, header = line 1) or row
    (Parquet) of each row."""
    df, lines = read_table(path, recipe.csv_separator, recipe.null_values)
    if not len(df.columns) or not len(df):
        raise ValueError(f"{path}: holds no rows")
    if df.columns[0] == "":  # the unnamed row index pandas and R write
        df = df.drop("")
    return df.with_columns(pl.lit(file_index, pl.Int32).alias(FILE_COL), pl.Series(LINE_COL, lines, pl.Int64))


def merged_schema(schemas: Sequence[Mapping[str, pl.DataType]], paths: Sequence[Path], n_train: int) -> pl.Schema:
    """The table's columns (the first file's order) and types (each column's supertype over the files, as Polars
    concatenates them): the files must hold the same columns, train files and test files alike."""
    first = list(schemas[0])
    for k, (p, s) in enumerate(zip(paths[1:], schemas[1:]), start=1):
        if set(s) != set(first):
            if k >= n_train:
                raise ValueError(f"{p}: columns differ from {paths[0]}'s")
            missing, extra = sorted(set(first) - set(s)), sorted(set(s) - set(first))
            raise ValueError(f"{p}: columns differ from {paths[0]}'s (missing {missing}, extra {extra})")
    empty = [pl.DataFrame(schema={c: s[c] for c in first}) for s in schemas]
    try:
        return pl.concat(empty, how="vertical_relaxed").schema
    except pl.exceptions.PolarsError as e:
        raise ValueError(f"{paths[0]}..: the files' column types do not agree: {str(e).splitlines()[0]}") from None


def as_merged(df: pl.DataFrame, schema: pl.Schema, like: RowTransform | None) -> pl.DataFrame:
    """A file's frame in the table's ``schema`` (cast as Polars concatenates them), then, for ``--like``, the
    model's columns as the model reads them (as ``predict`` and the server do)."""
    df = pl.concat([pl.DataFrame(schema=schema), df.select(list(schema))], how="vertical_relaxed")
    if like is not None:
        df = df.with_columns(like.typed(df, nulls_done=True).get_columns())
    return df


def clean_frame(df: pl.DataFrame, steps: Steps) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The good rows of ``df`` (with LABEL and the added columns; the raw columns kept as read: the fitted
    transform reads them) and the bad ones as (FILE_COL, LINE_COL, PROBLEM), both in ``df``'s order."""
    df = df.with_columns(steps.problem.alias(PROBLEM), *steps.added)
    bad = df.filter(pl.col(PROBLEM).is_not_null()).select(FILE_COL, LINE_COL, PROBLEM)
    good = df.filter(pl.col(PROBLEM).is_null()).with_columns(steps.label.cast(pl.UInt8).alias(LABEL)).drop(PROBLEM)
    return good, bad


def add_rejects(rejects: Rejects, bad: pl.DataFrame, paths: Sequence[Path], more: int = 0) -> None:
    """The bad rows ``bad`` (FILE_COL, LINE_COL, PROBLEM, in file order) to ``rejects`` (which raises for the
    first under ``error``); ``more``: bad rows beyond those listed."""
    for f, part in bad.group_by(FILE_COL, maintain_order=True):
        rejects.add(str(paths[f[0]]), [(line, problem, "") for line, problem in part.select(LINE_COL, PROBLEM).rows()])
    rejects.count += more


def feature_texts(df: pl.DataFrame, features: Sequence[str], roles: Roles, separator: str) -> dict[str, pl.Series]:
    """Each feature's texts in ``df`` as the transform looks them up, missing ones left out: a categorical column's
    (``category_text``: a number identified by value as a float's text, so that 2 and 2.0 are one value; a part of a
    timestamp), a multi-hot column's values (``multi_hot_lists``)."""
    derived = roles.derived_by_feature()
    texts = {}
    for c in features:
        if c in roles.multi_hot:
            texts[c] = multi_hot_lists(df[c], separator).explode().drop_nulls()  # an empty list: one null
        elif c in derived:
            d = derived[c]
            texts[c] = df.select(category_text(pl.col(d.column), d.text, d.time_format)).to_series()
        else:
            texts[c] = df.select(category_text(pl.col(c), "as_read")).to_series()
        texts[c] = texts[c].drop_nulls().alias("value")
    return texts


def value_counts(texts: pl.Series) -> pl.DataFrame:
    """(value, count) of ``texts``, counts as Int64."""
    return texts.value_counts(name="count").with_columns(pl.col("count").cast(pl.Int64))


def group_text(values: pl.Series) -> pl.Series:
    """The group column's values as the text its ids rank (missing: the empty text)."""
    return values.cast(pl.String).fill_null("")


def order_rows(df: pl.DataFrame, steps: Steps) -> pl.DataFrame:
    """One part's rows (train, or test; a day of ``refresh``) in the order the recipe says: as given, sorted by
    ``order_by`` (stable, missing last), or shuffled with ``shuffle_seed``."""
    if steps.order_by is not None:
        return df.sort(steps.order_by, maintain_order=True, nulls_last=True)
    if steps.shuffle_seed is not None:
        return df.sample(fraction=1.0, shuffle=True, seed=steps.shuffle_seed)
    return df


def write_blocks(lo: int, hi: int, size: int = WRITE_ROWS) -> Iterator[tuple[int, int]]:
    """[lo, hi) in blocks of at most ``size`` rows."""
    for a in range(lo, hi, size):
        yield a, min(hi, a + size)


class PolarsRows:
    """The table in this process's memory, in Polars' columnar form: memory grows with the data."""

    engine = "polars"

    def __init__(self):
        self.table: pl.DataFrame | None = None
        self.n_train_rows = 0  # rows read from the train files (before ``clean``)

    def read(self, paths: Sequence[Path], n_train_files: int, recipe: TableRecipe,
             like: RowTransform | None) -> pl.Schema:  # fmt: skip
        frames = [read_file(p, recipe, i) for i, p in enumerate(paths)]
        schema = merged_schema([f.schema for f in frames], paths, n_train_files)
        if like is not None:
            try:
                like.check_columns(list(schema))
            except RowError as e:  # (preprocess has no --missing-columns: a later day holds the model's columns)
                raise ValueError(
                    f"{paths[0]}: {e.said({})}; a day written --like a model holds every column it reads"
                ) from None
        self.n_train_rows = sum(len(f) for f in frames[:n_train_files])
        self.n_train_files = n_train_files
        self.table = as_merged(pl.concat([f.select(list(schema)) for f in frames], how="vertical_relaxed"), schema,
                               like)  # fmt: skip
        return self.table.schema

    def facts(self, column: str) -> ColumnFacts:
        return ColumnFacts.of(self.table[: self.n_train_rows], column)

    def clean(self, steps: Steps, rejects: Rejects, paths: Sequence[Path]) -> tuple[int, int]:
        good, bad = clean_frame(self.table, steps)
        add_rejects(rejects, bad, paths)
        is_train = pl.col(FILE_COL) < self.n_train_files
        train, test = order_rows(good.filter(is_train), steps), order_rows(good.filter(~is_train), steps)
        self.table = pl.concat([train, test])
        return len(self.table), len(train)

    def counts(self, features: Sequence[str], n_fit: int, texts: Callable[[pl.DataFrame], dict[str, pl.Series]]
               ) -> dict[str, pl.DataFrame]:  # fmt: skip
        return {c: value_counts(t) for c, t in texts(self.table[:n_fit]).items()}

    def encode(self, transform: RowTransform, by_value: RowTransform | None, group: str | None) -> None:
        self.encoded = transform.encode(self.table)
        self.by_value = by_value.encode(self.table)[1] if by_value is not None else self.encoded[1]
        self.groups = None
        if group is not None:  # one id per distinct value: its rank among the values as text
            self.groups = group_text(self.table[group]).rank("dense").to_numpy().astype(np.int64)

    def test_inputs(self, candidates: Sequence[str], lo: int, hi: int
                    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:  # fmt: skip
        rows = self.table[lo:hi]
        labels = rows[LABEL].to_numpy().astype(np.float64)
        numbers = {c: rows[RAW_PREFIX + c].to_numpy().astype(np.float64) for c in candidates}  # nulls: NaN
        return labels, numbers, self.by_value[lo:hi]

    def blocks(self, lo: int, hi: int) -> Iterator[Block]:
        numerical, categorical, lists = self.encoded
        offsets = [np.concatenate([[0], np.cumsum(lengths)]) for _, lengths in lists]
        labels = self.table[LABEL].to_numpy()
        for a, b in write_blocks(lo, hi):
            multi = [(flat[o[a] : o[b]], lengths[a:b]) for (flat, lengths), o in zip(lists, offsets)]
            yield Block(a, b, numerical[a:b], list(categorical[a:b].T), multi, labels[a:b],
                        None if self.groups is None else self.groups[a:b])  # fmt: skip

    def close(self) -> None:
        self.table = None
