"""``preprocess table`` on Apache Spark (``--engine spark``): the rows kept in Spark's parts, every step run in
Spark's tasks through the functions of one frame of rows that the Polars engine runs (``table_rows``), so that
both engines write the same dataset, byte for byte.

* read: one task a file, by ``table_reader``'s rules; the types merged over the files on the driver; each file's
  rows cast to them (and, for ``--like``, to the model's) in one task a file, which also states the roles' facts;
* clean: one task a file finds its bad rows (the driver names the first, in file order) and numbers its good ones;
  the row order is the files' (offsets on the driver), a stable sort by ``--order-by`` in Spark SQL, or the shuffle
  Polars draws for ``--shuffle-seed`` (the permutation of the row count, drawn on the driver and joined);
* fit: each task counts its rows' texts (``feature_texts``), Spark sums the counts, the driver gives the ids;
* transform: each task applies the fitted ``RowTransform`` (broadcast) to its rows; Spark sorts the encoded rows
  by row number into Parquet parts, which the driver streams into the dataset in order.

Scratch files lie in a directory beside the output (removed at the end): on a cluster it must be a path every
executor reads and writes (a shared file system), as the output's directory is.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.data.split_binary import DataError
from ctrkit.preprocess.output import REJECTS_KEPT, Rejects
from ctrkit.preprocess.spark_engine import spark_modules, start_session
from ctrkit.preprocess.table_recipe import (
    DISTINCT_MIN_ROWS,
    FILE_COL,
    LINE_COL,
    RAW_PREFIX,
    ColumnFacts,
    TableRecipe,
)
from ctrkit.preprocess.table_rows import (
    LABEL,
    PROBLEM,
    Block,
    Steps,
    add_rejects,
    as_merged,
    clean_frame,
    group_text,
    merged_schema,
    read_file,
    value_counts,
    write_blocks,
)
from ctrkit.preprocess.transform import RowError, RowTransform

POS, IDX, GROUP = "__ctrkit_pos", "__ctrkit_idx", "__ctrkit_group"  # a good row's place in its file; in the table
BATCH_ROWS = 1 << 16  # rows a task's Arrow batch holds
PART_ROWS = 1 << 20  # encoded rows a Parquet part holds, about


def _arrow():
    try:
        import pyarrow as pa
    except ImportError as e:
        raise ValueError("the Spark engine needs PyArrow: pip install 'ctrkit[spark]'") from e
    return pa


def _frame(batch) -> pl.DataFrame:
    return pl.from_arrow(_arrow().Table.from_batches([batch]))


def _batches(df: pl.DataFrame, schema) -> Iterator:
    """``df`` as Arrow batches of ``schema`` (Spark's types: plain strings and lists)."""
    table = df.to_arrow(compat_level=pl.CompatLevel.oldest()).cast(schema)
    yield from table.to_batches()


def _read_task(item: tuple[int, str], recipe: TableRecipe, scratch: str):
    """One file read (``read_file``) into the scratch directory: (file index, error or None, its types, rows)."""
    i, path = item
    try:
        df = read_file(Path(path), recipe, i)
    except ValueError as e:
        return i, str(e), None, 0
    df.write_parquet(f"{scratch}/{i:06d}.parquet")
    return i, None, dict(df.schema), len(df)


def _merge_task(i: int, schema: pl.Schema, like, scratch: str, facts: bool):
    """One file's rows in the table's types (``as_merged``) into the scratch directory, and (``facts``: a training
    file) each column's ``ColumnFacts`` (distinct values left to Spark)."""
    df = as_merged(pl.read_parquet(f"{scratch}/read/{i:06d}.parquet"), schema, like.value if like else None)
    found = {c: ColumnFacts.of(df, c, distinct=False) for c in df.columns if c not in (FILE_COL, LINE_COL)}
    stored = df.with_columns(pl.col(c).cast(pl.String) for c, t in df.schema.items() if t == pl.Null)
    stored.write_parquet(f"{scratch}/table/{i:06d}.parquet")
    return i, found if facts else None


def _clean_task(i: int, steps: Steps, scratch: str):
    """One file's good rows, numbered (POS), into the scratch directory: (file index, its first bad rows, bad rows,
    good rows)."""
    good, bad = clean_frame(pl.read_parquet(f"{scratch}/table/{i:06d}.parquet"), steps)
    good = good.with_columns(pl.col(LABEL).cast(pl.Int8), pl.int_range(pl.len(), dtype=pl.Int64).alias(POS))
    good.write_parquet(f"{scratch}/clean/{i:06d}.parquet")
    return i, bad.head(REJECTS_KEPT), len(bad), len(good)


def _count_task(batches, texts: Callable[[pl.DataFrame], dict[str, pl.Series]], schema):
    """(feature, value, count) of each batch's texts."""
    for batch in batches:
        for feature, text in texts(_frame(batch)).items():
            counts = value_counts(text)
            if len(counts):
                yield from _batches(counts.select(pl.lit(feature).alias("feature"), "value", "count"), schema)


def _texts_task(batches, column: str, schema):
    """The distinct texts of ``column`` in each batch (``group_text``)."""
    for batch in batches:
        yield from _batches(group_text(_frame(batch)[column]).unique().alias("value").to_frame(), schema)


def _encode_task(batches, transform, by_value, ranks, group: str | None, candidates: Sequence[str], schema):
    """Each batch's rows encoded by the fitted transform (``RowTransform.encode``), as the parts hold them: the row
    number and label, numerical n<j>, ids c<j>, multi-hot ids m<j>; for the value-id test the numbers r<j> and the
    ids by value v<j>; the group's id."""
    pa = _arrow()
    t, v = transform.value, by_value.value if by_value is not None else None
    for batch in batches:
        df = _frame(batch)
        numerical, categorical, lists = t.encode(df)
        columns = {IDX: df[IDX], LABEL: df[LABEL]}
        columns.update({f"n{j}": numerical[:, j] for j in range(numerical.shape[1])})
        columns.update({f"c{j}": categorical[:, j] for j in range(categorical.shape[1])})
        columns.update({f"r{j}": df[RAW_PREFIX + c] for j, c in enumerate(candidates)})
        if v is not None:
            by = v.encode(df)[1]
            columns.update({f"v{j}": by[:, j] for j in range(by.shape[1])})
        if group is not None:
            texts = group_text(df[group]).alias("value").to_frame()
            columns[GROUP] = texts.join(ranks.value, on="value", how="left", maintain_order="left")["rank"]
        table = pl.DataFrame(columns).to_arrow(compat_level=pl.CompatLevel.oldest())
        for j, (flat, lengths) in enumerate(lists):
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            table = table.append_column(f"m{j}", pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)))
        yield from table.select(schema.names).cast(schema).to_batches()


class SparkRows:
    """The table in Spark's parts (``table_rows``' steps, run in Spark's tasks), its scratch files in a directory
    beside ``out_dir``."""

    engine = "spark"

    def __init__(self, master: str, out_dir: Path):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the tasks run this Python (and its ctrkit)
        _arrow()
        self.spark = start_session(master)
        self.spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(BATCH_ROWS))
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.spark-", dir=out_dir.parent))
        self.facts_of: dict[int, dict[str, ColumnFacts]] = {}
        self.parts: list[tuple[int, Path]] | None = None

    def _run(self, items: Sequence, task: Callable) -> list:
        """``task`` of each item, one Spark task an item, results in the items' order."""
        sc = self.spark.sparkContext
        return sc.parallelize(list(items), max(1, len(items))).map(task).collect()

    def read(self, paths: Sequence[Path], n_train_files: int, recipe: TableRecipe,
             like: RowTransform | None) -> pl.Schema:  # fmt: skip
        for d in ("read", "table", "clean"):
            (self.scratch / d).mkdir()
        self.paths, self.n_train_files = list(paths), n_train_files
        read = sorted(self._run(list(enumerate(map(str, paths))),
                                partial(_read_task, recipe=recipe, scratch=str(self.scratch / "read"))))  # fmt: skip
        for _, error, _, _ in read:
            if error is not None:
                raise ValueError(error)
        schema = merged_schema([s for _, _, s, _ in read], paths, n_train_files)
        if like is not None:
            try:
                like.check_columns(list(schema))
            except RowError as e:  # (preprocess has no --missing-columns: a later day holds the model's columns)
                raise ValueError(
                    f"{paths[0]}: {e.said({})}; a day written --like a model holds every column it reads"
                ) from None
        shared = self.spark.sparkContext.broadcast(like) if like is not None else None
        merge = partial(_merge_task, schema=schema, like=shared, scratch=str(self.scratch))
        self.facts_of = {i: f for i, f in self._run(range(len(paths)), lambda i: merge(i, facts=i < n_train_files))
                         if f is not None}  # fmt: skip
        self.schema = as_merged(pl.DataFrame(schema=schema), schema, like).schema
        return self.schema

    def facts(self, column: str) -> ColumnFacts:
        parts = [self.facts_of[i][column] for i in sorted(self.facts_of)]
        found = ColumnFacts.merge(parts, 0)
        if self.schema[column] != pl.String or found.values < DISTINCT_MIN_ROWS:
            return found
        _, _, F = spark_modules()
        table = self.spark.read.parquet(str(self.scratch / "table"))
        train = table.filter(F.col(FILE_COL) < self.n_train_files)
        distinct = train.select(F.countDistinct(F.col(f"`{column}`"))).collect()[0][0]
        return ColumnFacts.merge(parts, int(distinct))

    def clean(self, steps: Steps, rejects: Rejects, paths: Sequence[Path]) -> tuple[int, int]:
        _, _, F = spark_modules()
        results = sorted(self._run(range(len(paths)), partial(_clean_task, steps=steps, scratch=str(self.scratch))),
                         key=lambda r: r[0])  # fmt: skip
        listed = pl.concat([bad for _, bad, _, _ in results])
        add_rejects(rejects, listed.select(FILE_COL, LINE_COL, PROBLEM), paths,
                    sum(n for _, _, n, _ in results) - len(listed))  # fmt: skip
        good = [n for _, _, _, n in results]
        n_train, total = sum(good[: self.n_train_files]), sum(good)
        offsets = np.concatenate([[0], np.cumsum(good)[:-1]]).astype(np.int64).tolist()
        starts = self.spark.createDataFrame(list(enumerate(offsets)), f"{FILE_COL} int, __start long")
        rows = self.spark.read.parquet(str(self.scratch / "clean")).join(F.broadcast(starts), FILE_COL)
        rows = rows.withColumn(IDX, F.col("__start") + F.col(POS)).drop("__start")  # the files' order
        if steps.order_by is not None:  # a stable sort, train rows before test rows
            key = (F.col(IDX) >= n_train).alias("__test")
            order = rows.select(IDX, key, F.col(f"`{steps.order_by}`").alias("__key"))
            order = order.orderBy("__test", F.col("__key").asc_nulls_last(), IDX)
            rows = self._renumber(rows, self._positions(order.select(F.col(IDX).alias("__old"))))
        elif steps.shuffle_seed is not None:  # the permutation Polars draws for so many rows (train, then test)
            new = np.empty(total, np.int64)
            for lo, hi in ((0, n_train), (n_train, total)):
                drawn = pl.int_range(hi - lo, eager=True).sample(fraction=1.0, shuffle=True, seed=steps.shuffle_seed)
                new[lo + drawn.to_numpy()] = np.arange(lo, hi)
            path = self.scratch / "shuffle.parquet"
            pl.DataFrame({"__old": np.arange(total), "__new": new}).write_parquet(path)
            rows = self._renumber(rows, self.spark.read.parquet(str(path)))
        self.rows = rows
        return total, n_train

    def _positions(self, ordered):
        """(__old, __new) of a sorted frame: each row's place in the order. A sorted frame's partitions are ranges
        in order, and a row's ``monotonically_increasing_id`` is its partition's number and its place there: stored
        once (so no second evaluation may draw other ranges), then the partitions' sizes give their offsets."""
        _, _, F = spark_modules()
        path = str(self.scratch / "order")
        ordered.select("__old", F.monotonically_increasing_id().alias("__m")).write.parquet(path)
        stored = self.spark.read.parquet(path).select("__old", F.shiftright(F.col("__m"), 33).alias("__p"),
                                                      (F.col("__m") % (1 << 33)).alias("__i"))  # fmt: skip
        sizes = sorted((r["__p"], r["n"]) for r in stored.groupBy("__p").agg(F.count("*").alias("n")).collect())
        bases = np.concatenate([[0], np.cumsum([n for _, n in sizes])[:-1]]).astype(np.int64).tolist()
        table = self.spark.createDataFrame([(p, b) for (p, _), b in zip(sizes, bases)], "__p long, __base long")
        return stored.join(F.broadcast(table), "__p").select("__old", (F.col("__base") + F.col("__i")).alias("__new"))

    def _renumber(self, rows, numbers):
        """``rows`` with their row number IDX replaced by ``numbers``' (__old -> __new), stored once."""
        renumbered = rows.join(numbers.withColumnRenamed("__old", IDX), IDX).drop(IDX)
        renumbered.withColumnRenamed("__new", IDX).write.parquet(str(self.scratch / "rows"))
        return self.spark.read.parquet(str(self.scratch / "rows"))

    def counts(self, features: Sequence[str], n_fit: int, texts: Callable[[pl.DataFrame], dict[str, pl.Series]]
               ) -> dict[str, pl.DataFrame]:  # fmt: skip
        pa = _arrow()
        _, _, F = spark_modules()
        schema = pa.schema([("feature", pa.string()), ("value", pa.string()), ("count", pa.int64())])
        fitting = self.rows.filter(F.col(IDX) < n_fit)
        counted = fitting.mapInArrow(partial(_count_task, texts=texts, schema=schema),
                                     "feature string, value string, count long")  # fmt: skip
        summed = pl.from_arrow(counted.groupBy("feature", "value").agg(F.sum("count").alias("count")).toArrow())
        summed = summed.with_columns(pl.col("value").cast(pl.String), pl.col("count").cast(pl.Int64))
        parts = summed.partition_by("feature", as_dict=True, include_key=False)
        empty = pl.DataFrame(schema={"value": pl.String, "count": pl.Int64})
        return {c: parts.get((c,), empty) for c in features}

    def encode(self, transform: RowTransform, by_value: RowTransform | None, group: str | None) -> None:
        pa = _arrow()
        _, _, F = spark_modules()
        sc = self.spark.sparkContext
        candidates = [c[len(RAW_PREFIX) :] for c in self.rows.columns if c.startswith(RAW_PREFIX)]
        ranks = None
        if group is not None:  # one id per distinct value: its rank among the values as text (Polars' rank)
            texts = self.rows.select(f"`{group}`").mapInArrow(
                partial(_texts_task, column=group, schema=pa.schema([("value", pa.string())])), "value string"
            )
            distinct = pl.from_arrow(texts.distinct().toArrow())["value"].cast(pl.String)
            ranks = sc.broadcast(distinct.to_frame().with_columns(distinct.rank("dense").cast(pl.Int64).alias("rank")))
        fields = [(IDX, pa.int64()), (LABEL, pa.int8())]
        fields += [(f"n{j}", pa.float32()) for j in range(len(transform.numerical))]
        fields += [(f"c{j}", pa.int64()) for j in range(len(transform.categorical))]
        fields += [(f"r{j}", pa.float64()) for j in range(len(candidates))]
        if by_value is not None:
            fields += [(f"v{j}", pa.int64()) for j in range(len(by_value.categorical))]
        fields += [(GROUP, pa.int64())] if group is not None else []
        fields += [(f"m{j}", pa.list_(pa.int64())) for j in range(len(transform.multi_hot))]
        schema = pa.schema(fields)
        spark_types = {pa.int64(): "long", pa.int8(): "byte", pa.float32(): "float", pa.float64(): "double",
                       pa.list_(pa.int64()): "array<long>"}  # fmt: skip
        ddl = ", ".join(f"`{name}` {spark_types[t]}" for name, t in fields)
        task = partial(_encode_task, transform=sc.broadcast(transform),
                       by_value=sc.broadcast(by_value) if by_value is not None else None, ranks=ranks, group=group,
                       candidates=candidates, schema=schema)  # fmt: skip
        encoded = self.rows.mapInArrow(task, ddl)
        total = self.rows.count()
        parts = self.scratch / "encoded"
        shutil.rmtree(parts, ignore_errors=True)
        encoded.repartitionByRange(max(1, total // PART_ROWS + 1), IDX).sortWithinPartitions(IDX).write.parquet(
            str(parts)
        )
        self.parts = []
        for p in sorted(parts.glob("*.parquet")):
            first = pl.scan_parquet(p).select(pl.col(IDX).min()).collect().item()
            if first is not None:
                self.parts.append((first, p))
        self.parts.sort()
        self.total = total

    def _rows_in(self, lo: int, hi: int) -> Iterator[pl.DataFrame]:
        """The encoded rows [lo, hi), in order, a part at a time."""
        expected = lo
        for k, (first, path) in enumerate(self.parts):
            end = self.parts[k + 1][0] if k + 1 < len(self.parts) else self.total
            if end <= lo or first >= hi:
                continue
            part = pl.read_parquet(path).filter(pl.col(IDX).is_between(lo, hi, closed="left"))
            idx = part[IDX].to_numpy()
            if not np.array_equal(idx, np.arange(expected, expected + len(idx))):
                raise DataError(f"{path}: Spark returned rows out of order near row {expected}")
            expected += len(idx)
            yield part
        if expected != hi:
            raise DataError(f"{self.scratch}: Spark returned rows up to {expected}, expected {hi}")

    def test_inputs(self, candidates: Sequence[str], lo: int, hi: int
                    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:  # fmt: skip
        rows = pl.concat(list(self._rows_in(lo, hi)))
        ids = "v" if "v0" in rows.columns else "c"
        columns = sorted((c for c in rows.columns if c[0] == ids and c[1:].isdigit()), key=lambda c: int(c[1:]))
        numbers = {c: rows[f"r{j}"].to_numpy().astype(np.float64) for j, c in enumerate(candidates)}
        return rows[LABEL].to_numpy().astype(np.float64), numbers, rows.select(columns).to_numpy().astype(np.int64)

    def blocks(self, lo: int, hi: int) -> Iterator[Block]:
        def numbered(prefix: str, df: pl.DataFrame) -> list[str]:
            return sorted((c for c in df.columns if c[0] == prefix and c[1:].isdigit()), key=lambda c: int(c[1:]))

        for part in self._rows_in(lo, hi):
            start = int(part[IDX][0])
            for a, b in write_blocks(0, len(part)):
                rows = part.slice(a, b - a)
                nums = numbered("n", rows)
                numerical = (
                    rows.select(nums).to_numpy().astype(np.float32) if nums else np.zeros((b - a, 0), np.float32)
                )
                multi = []
                for c in numbered("m", rows):
                    lengths = rows[c].list.len().to_numpy().astype(np.int64)
                    multi.append((rows[c].explode().drop_nulls().to_numpy().astype(np.int64), lengths))
                yield Block(start + a, start + b, numerical, [rows[c].to_numpy() for c in numbered("c", rows)], multi,
                            rows[LABEL].cast(pl.UInt8).to_numpy(),
                            rows[GROUP].to_numpy() if GROUP in rows.columns else None)  # fmt: skip

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)
