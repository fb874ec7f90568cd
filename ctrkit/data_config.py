"""Typed, frozen configuration of the data commands (synth, preprocess, transcode, gen-csv); the flags are generated
from these dataclasses as from config.py's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrkit.config import option
from ctrkit.data.feature_spec import MAX_CAPACITY
from ctrkit.field_types import COUNT, CTR_FOLDS, FRACTION, FREQUENCY_THRESHOLD, ROW_BLOCK, SEED, Range


@dataclass(frozen=True)
class SynthConfig:
    """``ctrkit synth``: which synthetic data, how much, where."""

    kind: str = option(
        "criteo-like",
        "criteo-like: a split-binary dataset of 13 numerical + 26 categorical features; outbrain: displays of "
        "2-12 ads with one click each, request- and item-level features, two multi-hot, display ids for MAP@12; "
        "criteo: raw Criteo-format TSV (--out names a file; .gz to compress); planted: first-order effects and "
        "pairwise interactions of the frequent ids of long-tailed vocabularies and a hidden state seen through noisy "
        "counts, with the test rows' Bayes-optimal AUC and the best AUC any model of the columns can reach in the "
        "spec's metadata; planted-tabular: the same with the signal mostly in nonlinear functions of 6 "
        "numerical features (a step, a sine, a product, a hinge) beside per-id effects of 4 categorical ones; "
        "planted-amounts: planted-tabular's data with the numerical features written as raw amounts "
        "(exp(1.5 x) * 10^j: heavy-tailed, 1 to 1e5 and beyond, float32), as prices or counts come; "
        "outbrain-raw: the raw Kaggle Outbrain files (clicks_train.csv, events.csv, "
        "promoted_content.csv, documents_*.csv, page_views.csv; --rows clicks rows) from a planted click model, "
        "for `ctrkit preprocess outbrain` (truth.json: the MAP@12 of the true scores); stream: --days days of "
        "click logs (DIR/day_1 ... DIR/day_N, each with train, validation and test; --rows rows a day) in the Criteo "
        "shape with raw 64-bit ids of dynamic features, where new ids appear every day, old ones fade and some "
        "effects drift (truth/<mapping>.f32: the true click probabilities)",
        (
            "criteo-like",
            "outbrain",
            "criteo",
            "planted",
            "planted-tabular",
            "planted-amounts",
            "outbrain-raw",
            "stream",
        ),
        positional=True,
    )
    out: Path | None = option(
        None, "dataset directory to create (a file for criteo)", required=True, writes="directory"
    )
    rows: int = option(300_000, "about this many samples, train + test", bounds=COUNT)
    tables: tuple[int, ...] | None = option(
        None,
        "comma-separated cardinalities of the categorical features, or a preset: criteo-kaggle-like (26 tables of 3 "
        "to 200,000 rows), criteo-1tb (Criteo 1TB's 26 tables at frequency threshold 15, 32.7M rows in all, as the "
        "seeds train on it), criteo-1tb-mlperf (the same hashed to at most 40M rows a table, 187.8M in all)",
        unset="criteo-kaggle-like",
        parse="table_sizes",
    )
    num_numerical: int = option(13, "numerical features", bounds=Range(0, 100_000))
    test_fraction: float = option(0.1, "share of rows in test/", bounds=FRACTION)
    seed: int = option(0, "random seed of the click model and samples", bounds=SEED)
    overwrite: bool = option(False, "replace an existing dataset directory")
    days: int = option(7, "stream: days to write", bounds=Range(1, 100_000))
    capacity: float = option(
        1.0,
        "stream: rows of each dynamic table, as a share of the ids its feature has on one day (plus the rare row)",
        bounds=Range(0, 1000, lo_open=True),
    )


def test_fraction_option() -> Any:
    """The ``--test-fraction`` option of the preprocessing recipes (exclusive with their ``--test-files``)."""
    return option(None, "last fraction of the rows as the test split", unset="0.1", exclusive="split", bounds=FRACTION)


def validation_fraction_option() -> Any:
    """The ``--validation-fraction`` option of the preprocessing recipes."""
    return option(
        None,
        "the last fraction of the train split becomes a 'validation' mapping (scored with the train vocabulary, "
        "as test is), for model selection during training",
        unset="none: training holds out the tail of train itself",
        bounds=Range(0.0, 1.0, hi_open=True),
    )


def raw_ids_option(columns: str) -> Any:
    """The ``--raw-ids`` option of a preprocessing recipe: which ``columns`` it takes and how their ids are made."""
    return option((), columns, parse="name_list", shown="none")


def capacity_option() -> Any:
    """The ``--capacity`` option of the preprocessing recipes (rows of each raw-id column's table)."""
    return option(None, "rows of each --raw-ids column's table (row 0 the rare row)",
                  unset="the rows its vocabulary would have at --frequency-threshold",
                  bounds=Range(2, MAX_CAPACITY))  # fmt: skip


def spark_master_option() -> Any:
    """The ``--spark-master`` option of the preprocessing commands (a new field for each config)."""
    return option("local[*]", "Spark master URL for --engine spark", shown="local[*]: all cores of this machine")


@dataclass(frozen=True)
class OutbrainPreprocessConfig:
    """``ctrkit preprocess outbrain``: the raw Kaggle Outbrain directory, the recipe's threshold and seed."""

    raw: Path | None = option(None, "directory of the raw Kaggle Outbrain CSV files (plain or .gz)", positional=True)
    out: Path | None = option(None, "dataset directory to create", required=True, writes="directory")
    frequency_threshold: int = option(
        2,
        "one-hot ids seen fewer times than this in the training rows share id 0 with missing values",
        bounds=FREQUENCY_THRESHOLD,
    )
    raw_ids: tuple[str, ...] = raw_ids_option(
        "comma-separated one-hot id columns (ad_id, document_id, ...; not geo_location*) kept as raw 64-bit ids "
        "for dynamic tables (train --admit-after, --eviction): the files' integer ids; missing 0"
    )
    capacity: int | None = capacity_option()
    seed: int = option(0, "seed of the per-display draw that puts 20% of days 0-10 in the evaluation set", bounds=SEED)
    ctr_folds: int = option(
        10,
        "the training displays are split into this many folds, and a training row's CTR features are computed "
        "over the other folds' rows, so that no training row's feature counts its own click (evaluation rows: "
        "over all training rows)",
        bounds=CTR_FOLDS,
    )
    bad_rows: str = option(
        "error",
        "error: stop at the first malformed row, naming file and line; skip: drop and count them",
        ("error", "skip"),
    )
    block_rows: int = option(
        1 << 17,
        "clicks_train.csv's rows are worked on this many at a time (twice: tallies, then features); memory grows "
        "with the block while it is worked on (about 0.7 KB a row), and the dataset does not depend on the block size",
        bounds=ROW_BLOCK,
    )
    engine: str = option(
        "polars",
        "polars: embedded, page views streamed; spark: page_views.csv (the real data's 2 billion rows) counted on "
        "Apache Spark (pip install 'ctrkit[spark]'), the other files read here. Both write byte-identical datasets",
        ("polars", "spark"),
    )
    spark_master: str = spark_master_option()
    overwrite: bool = option(False, "replace an existing dataset directory")
    no_progress: bool = option(False, "no progress bars")


@dataclass(frozen=True)
class CriteoPreprocessConfig:
    """``ctrkit preprocess criteo``: the raw files, the split, the recipe's threshold and the engine."""

    raw: tuple[Path, ...] = option(
        (), "raw TSV files (plain or .gz) of the train split, in order", positional=True, nargs="+"
    )
    out: Path | None = option(None, "dataset directory to create", required=True, writes="directory")
    test_files: tuple[Path, ...] | None = option(None, "raw files of the test split", nargs="+", exclusive="split")
    test_fraction: float | None = test_fraction_option()
    validation_fraction: float | None = validation_fraction_option()
    frequency_threshold: int = option(3, "FL: rarer categories share one id", bounds=FREQUENCY_THRESHOLD)
    raw_ids: tuple[str, ...] = raw_ids_option(
        "comma-separated categorical columns (C1..C26, or 'all') kept as raw 64-bit ids for dynamic tables "
        "(train --admit-after, --eviction): each value's exact key, int(value, 16) + (digits << 60); missing 0"
    )
    capacity: int | None = capacity_option()
    bad_rows: str = option(
        "error",
        "error: stop at the first malformed row, naming file and line; skip: drop and count them, keeping the "
        "first 20 in rejects.jsonl",
        ("error", "skip"),
    )
    engine: str = option(
        "polars",
        "polars: embedded, streaming, memory bounded; spark: Apache Spark (pip install 'ctrkit[spark]'), for "
        "data that outgrows one machine. Both write byte-identical datasets",
        ("polars", "spark"),
    )
    spark_master: str = spark_master_option()
    like: Path | None = option(
        None, "a checkpoint (or a dataset directory) made from Criteo days whose vocabularies write these days: its "
        "values keep their ids, values it has not seen get new ids after its own (where seen --frequency-threshold "
        "times in the train split), raw-id columns stay raw with its tables' rows, and `train --continue-from` it "
        "grows its tables for the new values: the next day of the log (either engine, the same bytes)",
        unset="fit the vocabularies on these days",
    )  # fmt: skip
    overwrite: bool = option(False, "replace an existing dataset directory")
    no_progress: bool = option(False, "no progress bars")


@dataclass(frozen=True)
class TablePreprocessConfig:
    """``ctrkit preprocess table``: CSV or Parquet tables with a header, the column roles and the split."""

    raw: tuple[Path, ...] = option(
        (), "CSV or Parquet files (.parquet/.pq) of the train split, with a header, in order", positional=True,
        nargs="+",
    )  # fmt: skip
    out: Path | None = option(None, "dataset directory to create", required=True, writes="directory")
    label: str | None = option(None, "the label column (0/1 or true/false unless --positive or --label-threshold)",
                               required=True)  # fmt: skip
    positive: str | None = option(None, "the label is 1 where the label column equals this value (as text), else 0")
    label_threshold: float | None = option(
        None,
        "the label is 1 where the label column is at least this number, else 0 (e.g. 4 for ratings 1-5)",
        bounds=Range(-3.4e38, 3.4e38),
    )
    categorical: tuple[str, ...] = option(
        (), "comma-separated categorical columns (ids, codes); text and boolean columns are categorical unless named "
        "elsewhere", parse="name_list", shown="text and boolean columns",
    )  # fmt: skip
    numerical: tuple[str, ...] = option(
        (), "comma-separated numerical columns (amounts, counts); float columns are numerical unless named elsewhere",
        parse="name_list", shown="float columns",
    )  # fmt: skip
    multi_hot: tuple[str, ...] = option(
        (), "comma-separated multi-hot columns: text of values separated by --separator (Parquet list columns are "
        "multi-hot unless named elsewhere)", parse="name_list", shown="Parquet list columns",
    )  # fmt: skip
    drop: tuple[str, ...] = option((), "comma-separated columns to leave out", parse="name_list", shown="none")
    integers: str = option(
        "error", "the role of integer columns no flag names: error (refused, naming them: an integer may be an id or "
        "an amount), categorical or numerical", ("error", "categorical", "numerical"),
    )  # fmt: skip
    also_categorical: tuple[str, ...] = option(
        ("auto",), "comma-separated numerical columns that are also categorical features, <column>_id: each exact "
        "value an id, for numbers that identify something (a household's repeated amounts, codes); 'auto': those "
        "whose exact values predict the label on held-out training rows (the tail train holds out, or the "
        "validation rows) clearly better than a logistic regression of the other columns and 16 quantile buckets "
        "of each number does (summary.json keeps each column's test); 'none': no column", parse="name_list",
        shown="auto",
    )  # fmt: skip
    separator: str = option("|", "what separates the values of a multi-hot text column")
    combiner: str = option(
        "auto", "how each multi-hot column's values are pooled in the models, written to the feature spec (train "
        "--combiner overrides it): sum (the clicks add the values' effects, however many there are), mean (they "
        "average them), or auto: the one whose additive logistic regression predicts held-out training rows (the "
        "tail train holds out, or the validation rows) better (summary.json keeps each column's test)",
        ("auto", "sum", "mean"),
    )  # fmt: skip
    time: tuple[str, ...] = option(
        ("auto",), "comma-separated timestamp columns read as parts of time, each part a categorical feature "
        "<column>_<part> (hour of day, day of week: what clicks depend on), which predict and the server derive "
        "from the raw timestamp too; 'auto': each text, date or datetime column named nowhere else (the --order-by "
        "column too) whose first value is a timestamp (ISO 8601 and its kin: %Y-%m-%dT%H:%M:%S, %Y-%m-%d %H:%M, "
        "%Y/%m/%d %H:%M:%S; an offset or Z at the end is left out: the hour is the writer's); 'none': no column",
        parse="name_list", shown="auto",
    )  # fmt: skip
    time_parts: tuple[str, ...] = option(
        ("hour", "weekday"), "comma-separated parts read of each timestamp: hour (0-23), weekday (1 Monday - 7), "
        "hour_of_week (0-167), day (of the month), month", parse="name_list", shown="hour,weekday",
    )  # fmt: skip
    time_format: str | None = option(
        None, "the timestamps' format: a strftime pattern (e.g. '%d/%m/%Y %H:%M'), or unix / unix_ms for integer "
        "seconds / milliseconds since 1970 (a value of another format is a bad row)",
        unset="the first of the formats tried that reads a column's first value",
    )  # fmt: skip
    order_by: str | None = option(
        None, "sort the rows by this column (e.g. a timestamp; stable) before splitting; not a feature unless named "
        "(a timestamp is read as parts of time: --time)", unset="the files' order", exclusive="order",
    )  # fmt: skip
    shuffle_seed: int | None = option(
        None, "shuffle the rows with this seed before splitting, for data whose order means nothing",
        exclusive="order", bounds=SEED
    )  # fmt: skip
    group: str | None = option(
        None, "the column whose equal values are ranked together (a display or session id): the map channel of the "
        "validation and test mappings, so that evaluation reports MAP@12; not a feature", unset="none",
    )  # fmt: skip
    test_files: tuple[Path, ...] | None = option(None, "files of the test split", nargs="+", exclusive="split")
    test_fraction: float | None = test_fraction_option()
    validation_fraction: float | None = validation_fraction_option()
    frequency_threshold: int = option(
        3, "categorical values seen fewer times in the train split share one id", bounds=FREQUENCY_THRESHOLD
    )
    raw_ids: tuple[str, ...] = raw_ids_option(
        "comma-separated categorical columns kept as raw 64-bit ids for dynamic tables (train --admit-after, "
        "--eviction): XXH64 of the value's text (seed 0) as int64; missing 0"
    )
    capacity: int | None = capacity_option()
    like: Path | None = option(
        None, "a checkpoint (or a dataset directory) whose carried preprocessing writes this table: its columns, "
        "roles, types, null values and vocabularies (no role flags then); values it has not seen get new ids after "
        "its own (where seen --frequency-threshold times in the train split), so its values keep their ids and "
        "`train --continue-from` it grows its tables for the new ones: a later day of the same log",
        unset="fit the preprocessing on this table",
    )  # fmt: skip
    null_values: tuple[str, ...] = option(
        ("NA", "NaN", "nan", "null", "NULL"), "comma-separated texts a CSV field reads as missing, besides the empty "
        "field", parse="name_list",
    )  # fmt: skip
    csv_separator: str = option(",", "the CSV field separator: one byte, or 'tab' (or '\\t') for a tab")
    bad_rows: str = option(
        "error",
        "error: stop at the first row with a bad label or number, naming file and line; skip: drop and count them",
        ("error", "skip"),
    )
    engine: str = option(
        "polars",
        "polars: the table held in this process's memory; spark: kept in Apache Spark's parts, each file read, the "
        "vocabularies counted and the transform applied in Spark's tasks (pip install 'ctrkit[spark]'), for tables "
        "that outgrow one machine's memory (scratch files beside --out, which on a cluster must be a shared file "
        "system). Both write byte-identical datasets",
        ("polars", "spark"),
    )
    spark_master: str = spark_master_option()
    overwrite: bool = option(False, "replace an existing dataset directory")
    no_progress: bool = option(False, "no progress bars")


@dataclass(frozen=True)
class TranscodeConfig:
    """``ctrkit transcode``: CSV/Parquet chunks in, split binary out."""

    input: Path | None = option(None, "directory holding feature_spec.yaml and the data", required=True)
    output: Path | None = option(None, "dataset directory to create", required=True, writes="directory")
    overwrite: bool = option(False, "replace an existing output directory")
    chunk_size: int = option(
        1 << 20,
        "rows read and written at a time; memory stays bounded by it, not by the data",
        bounds=ROW_BLOCK,
    )


@dataclass(frozen=True)
class GenCsvConfig:
    """``ctrkit gen-csv``: random CSV files for a CSV-type feature spec."""

    feature_spec: Path | None = option(None, "a feature_spec.yaml with csv chunks", required=True)
    out: Path | None = option(None, "directory for the CSV files and the spec", required=True, writes="directory")
    rows: int = option(1000, "rows per mapping", bounds=COUNT)
    seed: int = option(0, "random seed", bounds=SEED)
