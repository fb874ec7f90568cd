"""The Criteo recipe on Apache Spark, for data that outgrows one machine.

Spark parses, validates, numbers the rows, counts the train split's category keys and maps keys to
ids; the driver builds the vocabularies with the same functions as the Polars engine
(``preprocess.vocabulary``) and writes the dataset with the same writer (``preprocess.output``), so
both engines produce byte-identical files. Row order is the input order: lines are numbered from
Spark's file blocks (``input_file_block_start``) and each partition's ordered ids, never by a global
sort of the raw data.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from ctrkit.columns import CLICKS, LABEL_PROBLEM, NON_CLICKS
from ctrkit.data.split_binary import DataError
from ctrkit.preprocess import vocabulary as vocab_mod
from ctrkit.preprocess.criteo import CriteoRecipe, check_arguments, numerical_transform
from ctrkit.preprocess.outbrain_files import NULLS
from ctrkit.preprocess.output import REJECTS_KEPT, DatasetOutput, Rejects
from ctrkit.preprocess.table_reader import check_text, header_names, open_bytes

if TYPE_CHECKING:
    from ctrkit.preprocess.like import Like

WRITE_ROWS = 1 << 18


def spark_modules():
    try:
        from pyspark.sql import SparkSession, Window
        from pyspark.sql import functions as F
    except ImportError as e:
        raise ValueError("the Spark engine needs PySpark: pip install 'ctrkit[spark]'") from e
    return SparkSession, Window, F


def start_session(master: str = "local[*]"):
    """A SparkSession for preprocessing (UI off, ANSI casts off so bad values become nulls we name)."""
    SparkSession, _, _ = spark_modules()
    spark = (
        SparkSession.builder.master(master)
        .appName("ctrkit-preprocess")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.ansi.enabled", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _lines(spark, paths: Sequence[Path], first_file: int):
    """(file, line_no, line) of every line of ``paths``; line numbers from per-block offsets."""
    _, _, F = spark_modules()
    frames = []
    for i, path in enumerate(paths):
        with open_bytes(path) as f:  # the first record by the table reader's rules, as the Polars engine reads it
            check_text(path, f.readline(1 << 20))
        raw = spark.read.text(str(path)).select(
            F.lit(first_file + i).alias("file"),
            F.input_file_block_start().alias("block"),
            F.monotonically_increasing_id().alias("mid"),
            F.col("value").alias("line"),
        )
        blocks = raw.groupBy("block").agg(F.count("*").alias("n"), F.min("mid").alias("first")).collect()
        if not blocks:
            raise ValueError(f"{path}: input file is empty")
        base, offsets = 1, []
        for b in sorted(blocks, key=lambda r: r["block"]):
            offsets.append((b["block"], base, b["first"]))
            base += b["n"]
        table = spark.createDataFrame(offsets, "block long, base long, first long")
        frames.append(
            raw.join(F.broadcast(table), "block").select(
                "file", "block", (F.col("base") + F.col("mid") - F.col("first")).alias("line_no"), "line"
            )
        )
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def _parse(df, recipe: CriteoRecipe):
    """Adds the typed fields (label, numerical as long with missing -> -2, category keys) and ``problem``."""
    _, _, F = spark_modules()
    names = [recipe.field_name(i) for i in range(recipe.num_fields)]
    nums, cats = names[1 : 1 + recipe.num_numerical], names[1 + recipe.num_numerical :]
    fields = F.split(F.col("line"), "\t", -1)
    df = df.select("file", "block", "line_no", "line", F.size(fields).alias("_n"), fields.alias("_f"))
    df = df.select("*", *[F.get(F.col("_f"), i).alias(n) for i, n in enumerate(names)])
    checks = [
        F.when(
            F.col("_n") != recipe.num_fields,
            F.format_string(f"expected {recipe.num_fields} tab-separated fields, found %d", F.col("_n")),
        ),
        F.when(F.col("label").isNull(), F.lit("label: missing label")).when(
            ~F.lower(F.col("label")).isin(*CLICKS, *NON_CLICKS),
            F.format_string(LABEL_PROBLEM.format(name="label", value="%s"), F.col("label")),
        ),
    ]
    for n in nums:
        bad = (F.col(n) != "") & ~F.col(n).rlike(r"^[+-]?[0-9]{1,18}$")
        checks.append(F.when(bad, F.format_string(f"{n}: '%s' is not an integer", F.col(n))))
    for c in cats:
        bad = (F.col(c) != "") & ~F.col(c).rlike(f"^[0-9a-fA-F]{{1,{vocab_mod.MAX_DIGITS}}}$")
        checks.append(
            F.when(bad, F.format_string(f"{c}: '%s' is not a hexadecimal category (1 to 15 digits)", F.col(c)))
        )
    key = {
        c: F.when(F.length(c) == 0, F.lit(vocab_mod.MISSING_KEY).cast("long")).otherwise(
            F.conv(F.col(c), 16, 10).cast("long") + F.length(c).cast("long") * F.lit(1 << vocab_mod.LENGTH_SHIFT)
        )
        for c in cats
    }
    return df.select(
        "file",
        "block",
        "line_no",
        "line",
        F.coalesce(*checks).alias("problem"),
        F.lower(F.col("label")).isin(*CLICKS).cast("byte").alias("label"),
        *[F.coalesce(F.col(n).cast("long"), F.lit(-2).cast("long")).alias(n) for n in nums],
        *[key[c].alias(c) for c in cats],
    )


def _rejects(parsed, files: Sequence[Path], rejects: Rejects) -> None:
    """Raises on the first bad row (``error``) or counts them and keeps the first few (``skip``)."""
    _, _, F = spark_modules()
    bad = parsed.filter(F.col("problem").isNotNull())
    first = bad.orderBy("file", "line_no").select("file", "line_no", "problem", "line").limit(REJECTS_KEPT).collect()
    if not first:
        return
    by_file: dict[int, list] = {}
    for r in first:
        by_file.setdefault(r["file"], []).append((r["line_no"], r["problem"], r["line"]))
    for f, rows in sorted(by_file.items()):
        rejects.add(str(files[f]), rows)  # raises for the first row under "error"
    rejects.count += bad.count() - len(first)


def _number_good_rows(good, spark):
    """Adds ``idx``: the 0-based position of each good row in input order."""
    _, Window, F = spark_modules()
    sizes = good.groupBy("file", "block").count().collect()
    base, offsets = 0, []
    for r in sorted(sizes, key=lambda r: (r["file"], r["block"])):
        offsets.append((r["file"], r["block"], base))
        base += r["count"]
    table = spark.createDataFrame(offsets or [(0, 0, 0)], "file int, block long, base long")
    within = F.row_number().over(Window.partitionBy("file", "block").orderBy("line_no")) - 1
    numbered = good.join(F.broadcast(table), ["file", "block"]).withColumn("idx", F.col("base") + within)
    return numbered.drop("base"), base


def _train_counts(train, cats: Sequence[str]) -> list[pl.DataFrame]:
    """(key, count) per category over the train rows, all columns in one Spark job."""
    _, _, F = spark_modules()
    pairs = ", ".join(f"{j}, `{c}`" for j, c in enumerate(cats))
    stacked = train.select(F.expr(f"stack({len(cats)}, {pairs}) as (col, key)"))
    rows = stacked.groupBy("col", "key").count().collect()
    counts = pl.DataFrame(
        {"col": [r["col"] for r in rows], "key": [r["key"] for r in rows], "count": [r["count"] for r in rows]},
        schema={"col": pl.Int64, "key": pl.Int64, "count": pl.Int64},
    )
    return [counts.filter(pl.col("col") == j).select("key", "count") for j in range(len(cats))]


def preprocess_criteo_spark(
    raw_files: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    recipe: CriteoRecipe | None = None,
    test_files: Sequence[str | os.PathLike] | None = None,
    test_fraction: float | None = None,
    validation_fraction: float | None = None,
    bad_rows: str = "error",
    overwrite: bool = False,
    progress: bool = False,
    master: str = "local[*]",
    like: Like | None = None,
) -> dict:
    """Raw Criteo TSV -> a split-binary dataset on Spark; arguments and result as ``preprocess_criteo``.

    Args:
        master: Spark master URL (``local[*]``: every core of this machine; ``spark://host:7077``, ...).
    """
    recipe = recipe or CriteoRecipe()
    if like is not None:
        recipe = like.criteo_recipe(recipe)
    check_arguments(recipe, raw_files, test_files, test_fraction, bad_rows, validation_fraction)
    _, _, F = spark_modules()
    start = time.perf_counter()
    train_paths = [Path(p) for p in raw_files]
    test_paths = [Path(p) for p in test_files] if test_files is not None else []
    paths = train_paths + test_paths
    for path in paths:
        if not path.exists():
            raise ValueError(f"{path}: input file not found")
        if path.stat().st_size == 0:
            raise ValueError(f"{path}: input file is empty")
    names = [recipe.field_name(i) for i in range(recipe.num_fields)]
    nums, cats = names[1 : 1 + recipe.num_numerical], names[1 + recipe.num_numerical :]
    rejects = Rejects(bad_rows)
    spark = start_session(master)
    with DatasetOutput(out_dir, recipe, overwrite, like) as out:
        parsed = _parse(_lines(spark, paths, 0), recipe).cache()
        _rejects(parsed, paths, rejects)
        good, total = _number_good_rows(parsed.filter(F.col("problem").isNull()), spark)
        if test_files is None:
            n_train = total - int(round(total * test_fraction))
        else:
            n_train = good.filter(F.col("file") < len(train_paths)).count()
        bounds = out.split(total, n_train, validation_fraction)
        good = good.select("idx", "label", *nums, *cats).cache()
        train = good.filter(F.col("idx") < bounds[0][2])  # the train mapping's rows make the vocabularies
        vocabularies = [vocab_mod.vocabulary(c, recipe.frequency_threshold) for c in _train_counts(train, cats)]
        if like is not None:  # the model's vocabularies, extended by the values it has not seen
            carried, threshold = like.transform.vocabularies, recipe.frequency_threshold
            vocabularies = [v if c in recipe.raw_ids else vocab_mod.extend_keyed(carried[f"cat_{i}.bin"], v, threshold)
                            for i, (c, v) in enumerate(zip(cats, vocabularies))]  # fmt: skip
        encoded = good
        for c, v in zip(cats, vocabularies):
            if c in recipe.raw_ids:  # the value's key is the raw id
                encoded = encoded.withColumn(f"_id_{c}", F.col(c))
                continue
            pairs = list(zip(v["key"].to_list(), v["id"].to_list())) or [(-1, 0)]
            table = spark.createDataFrame(pairs, f"{c} long, _id_{c} long")
            encoded = encoded.join(F.broadcast(table), c, "left")
        encoded = encoded.select(
            "idx", "label", *nums, *[F.coalesce(F.col(f"_id_{c}"), F.lit(0).cast("long")).alias(c) for c in cats]
        )
        parts_dir = out.scratch / "encoded"
        encoded.repartitionByRange(max(1, total // 2_000_000 + 1), "idx").sortWithinPartitions("idx").write.parquet(
            str(parts_dir)
        )
        out.start(vocabularies)
        _write_in_order(out, parts_dir, total, nums, cats)
        parsed.unpersist()
        good.unpersist()
        summary = out.finish("spark", rejects, time.perf_counter() - start)
    return summary


def _write_in_order(out: DatasetOutput, parts_dir: Path, total: int, nums, cats) -> None:
    """Streams Spark's Parquet parts, in ``idx`` order, into the mappings."""
    parts = []
    for p in sorted(parts_dir.glob("*.parquet")):
        first = pl.scan_parquet(p).select(pl.col("idx").min()).collect().item()
        if first is not None:
            parts.append((first, p))
    expected = 0
    for _, p in sorted(parts):
        for batch in pl.read_parquet(p).iter_slices(WRITE_ROWS):
            idx = batch["idx"].to_numpy()
            if len(idx) and not np.array_equal(idx, np.arange(expected, expected + len(idx))):
                raise DataError(f"{p}: Spark returned rows out of order near row {expected}")
            expected += len(idx)
            numerical = numerical_transform(batch.select(nums).to_numpy()) if nums else None
            ids = [batch[c].to_numpy() for c in cats]
            labels = batch["label"].cast(pl.UInt8).to_numpy()
            out.append_rows(expected - len(idx), numerical if nums else None, ids, labels)
    if expected != total:
        raise DataError(f"{parts_dir}: Spark returned {expected} rows, expected {total}")


INTEGER = r"^[+-]?[0-9]+$"  # what Polars's non-strict Int64 cast accepts (no spaces, no decimals)


def page_view_counts_spark(path: Path, rejects: Rejects, spark) -> pl.DataFrame:
    """Views per document of Outbrain's ``page_views.csv`` counted on Spark (the real file: 2 billion rows,
    ~100 GB), as ``preprocess.outbrain.page_view_counts`` counts them: a ``document_id`` that is missing or
    not an integer makes the row bad (the error names the file and line; with ``skip`` it is counted).
    One pass over the file counts the good and the bad rows alike; only an error reads it again, numbering
    its lines to name the first bad one."""
    _, _, F = spark_modules()
    header = header_names(path, ",", separator_flags=None)  # page_views.csv: commas, as the Polars engine reads it
    if "document_id" not in header:
        raise DataError(f"{path}: lacks the column document_id (header: {header})")

    def document(raw):  # (value as read, with the null spellings as null; the id, null when bad)
        value = F.when(raw.isin(*NULLS), F.lit(None)).otherwise(raw)
        return value, F.when(value.rlike(INTEGER), value.cast("long"))

    _, doc = document(F.col("document_id"))
    counts = spark.read.option("header", True).csv(str(path)).groupBy(doc.alias("doc")).count().collect()
    bad = sum(r["count"] for r in counts if r["doc"] is None)
    if bad and rejects.policy == "error":
        lines = _lines(spark, [path], 0).filter(F.col("line_no") > 1)  # the header is line 1
        value, doc = document(F.element_at(F.split(F.col("line"), ","), header.index("document_id") + 1))
        first = lines.select("line_no", value.alias("value"), doc.alias("doc")).filter(F.col("doc").isNull())
        row = first.orderBy("line_no").limit(1).collect()[0]
        shown = row["value"]
        raise DataError(
            f"{path}:{row['line_no']}: document_id: expected an integer, got "
            f"{'nothing' if shown is None else repr(shown)} (set `bad_rows` to skip to drop bad rows)"
        )
    rejects.count += bad
    good = [r for r in counts if r["doc"] is not None]
    return pl.DataFrame(
        {"document_id": [r["doc"] for r in good], "views": [r["count"] for r in good]},
        schema={"document_id": pl.Int64, "views": pl.UInt32},
    )
