"""Data commands: synth, preprocess, transcode, gen-csv."""

from __future__ import annotations

import argparse

from ctrkit.cli.options import add_command, config_from
from ctrkit.data_config import (
    CriteoPreprocessConfig,
    GenCsvConfig,
    OutbrainPreprocessConfig,
    SynthConfig,
    TablePreprocessConfig,
    TranscodeConfig,
)
from ctrkit.preprocess.value_ids import MIN_HELD_OUT

# heavy modules (torch above all, ~1.2 s) are imported by the handlers that use them, so that
# `ctrkit preprocess` and `ctrkit --help` start quickly


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "synth", synth, (SynthConfig,))
    p = sub.add_parser(
        "preprocess",
        help="raw click logs -> a split-binary dataset",
        description="Runs a preprocessing recipe on raw logs and writes a ctrkit dataset (split binary + "
        "feature_spec.yaml), the vocabularies (vocab/<column>.parquet: value, count, id) and summary.json.",
    )
    recipes = p.add_subparsers(dest="recipe", required=True, help="the raw format and its recipe")
    add_command(recipes, "criteo", preprocess, (CriteoPreprocessConfig,))
    add_command(recipes, "outbrain", preprocess_outbrain, (OutbrainPreprocessConfig,))
    add_command(recipes, "table", preprocess_table, (TablePreprocessConfig,))
    add_command(sub, "transcode", transcode, (TranscodeConfig,))
    add_command(sub, "gen-csv", gen_csv, (GenCsvConfig,))


def synth(args: argparse.Namespace) -> int:
    """write synthetic data: Criteo-like, Outbrain-like or planted datasets, or raw Criteo TSV and Outbrain files

    criteo-like (default): train/ and test/ split-binary mappings with power-law ids and a planted click
    signal (per-id effects, pairwise latent interactions, nonlinear numerical effects). outbrain: displays
    of 2-12 ads with one click each, multi-hot topics and display ids for MAP@12. criteo: the same click
    model as raw Criteo-format TSV, for `ctrkit preprocess criteo`. planted: a click model unlike
    criteo-like's (signal on the frequent ids of long-tailed vocabularies only), for measuring models
    against baselines; the spec records the best achievable test AUC. planted-tabular: the same for a
    click model whose signal is mostly nonlinear in 6 numerical features; planted-amounts: that data with
    its numerical features as raw, heavy-tailed amounts. stream: days of click logs with raw ids (dynamic
    features) whose vocabulary changes every day, to train day by day (`train --continue-from`).
    """
    # one job: the command's dispatch: one generator call per kind of data, with its summary line
    import numpy as np

    from ctrkit.data.dataset import SplitBinaryDataset

    cfg: SynthConfig = config_from(args, SynthConfig)
    if cfg.kind == "stream":
        from ctrkit.data.synthetic_stream import STREAM_VOCABULARIES, write_stream

        days = write_stream(cfg.out, cfg.days, cfg.rows, cfg.tables or STREAM_VOCABULARIES, cfg.capacity, cfg.seed,
                            cfg.overwrite, num_numerical=cfg.num_numerical)  # fmt: skip
        print(f"wrote {cfg.out}: {len(days)} days (day_1 ... day_{len(days)}) of {cfg.rows:,} rows with raw ids")
        return 0
    if cfg.kind == "criteo":
        from ctrkit.data.synthetic import CRITEO_LIKE_CARDINALITIES, write_criteo_tsv

        tables = cfg.tables or CRITEO_LIKE_CARDINALITIES
        out = write_criteo_tsv(cfg.out, cfg.rows, tables, cfg.num_numerical, cfg.seed, overwrite=cfg.overwrite)
        print(f"wrote {out}: {cfg.rows} raw rows (label, {cfg.num_numerical} integer, {len(tables)} hashed columns)")
        return 0
    if cfg.kind.startswith("planted"):
        from ctrkit.data.synthetic_planted import GENERATORS, generate_planted

        if cfg.tables is not None or cfg.num_numerical != 13:
            raise ValueError("--tables and --num-numerical apply to the criteo-like dataset only")
        family = {kind: family for family, kind in GENERATORS.items()}[cfg.kind]
        spec = generate_planted(cfg.out, cfg.rows, cfg.test_fraction, cfg.seed, cfg.overwrite, family=family)
        sizes = [len(SplitBinaryDataset(spec, m, check_ids=False)) for m in ("train", "test")]
        observable = spec.metadata.get("observable_test_auc")
        best = "" if observable is None else f", the best any model of the columns can at {observable:.4f}"
        print(f"wrote {cfg.out}: {sizes[0]} train + {sizes[1]} test samples; the true click odds rank the test "
              f"rows at AUC {spec.metadata['bayes_test_auc']:.4f}{best}")  # fmt: skip
        return 0
    if cfg.kind == "outbrain-raw":
        from ctrkit.data.synthetic_outbrain_raw import generate_outbrain_raw

        if cfg.tables is not None or cfg.num_numerical != 13:
            raise ValueError("--tables and --num-numerical apply to the criteo-like dataset only")
        truth = generate_outbrain_raw(cfg.out, cfg.rows, cfg.seed, overwrite=cfg.overwrite)
        print(f"wrote {cfg.out}: {truth['clicks_rows']:,} clicks rows of {truth['displays']:,} displays and the "
              f"other raw Outbrain files; ranking by the true scores gives MAP@12 "
              f"{truth['true_score_map12']:.4f}")  # fmt: skip
        return 0
    if cfg.kind == "outbrain":
        from ctrkit.data.synthetic_outbrain import generate_outbrain

        if cfg.tables is not None or cfg.num_numerical != 13:
            raise ValueError("--tables and --num-numerical apply to the criteo-like dataset only")
        spec = generate_outbrain(cfg.out, cfg.rows, cfg.test_fraction, cfg.seed, overwrite=cfg.overwrite)
        test = SplitBinaryDataset(spec, "test", check_ids=False)
        n_train = len(SplitBinaryDataset(spec, "train", check_ids=False))
        print(
            f"wrote {cfg.out}: {n_train} train + {len(test)} test rows, {len(np.unique(test.groups()))} test "
            f"displays; {len(spec.onehot_features)} one-hot + {len(spec.multi_hot_features)} multi-hot categorical, "
            f"{len(spec.numerical_features)} numerical features"
        )
        return 0
    from ctrkit.data.synthetic import CRITEO_LIKE_CARDINALITIES, generate_dataset

    tables = cfg.tables or CRITEO_LIKE_CARDINALITIES
    spec = generate_dataset(
        cfg.out, cfg.rows, tables, cfg.num_numerical, cfg.test_fraction, cfg.seed, overwrite=cfg.overwrite
    )
    sizes = [len(SplitBinaryDataset(spec, m, check_ids=False)) for m in ("train", "test")]
    print(
        f"wrote {cfg.out}: {sizes[0]} train + {sizes[1]} test samples, {len(tables)} categorical "
        f"(cardinalities {min(tables)}..{max(tables)}), {cfg.num_numerical} numerical features"
    )
    return 0


def preprocess(args: argparse.Namespace) -> int:
    """Criteo TSV: label, 13 integers, 26 hashed categories

    Criteo recipe: integers x -> log(max(x, -2) + 3), missing -> 0; categories seen fewer than
    --frequency-threshold times in the train split share the rare id 1, the others get ids from 2 by
    descending frequency (ties by value), id 0 is missing/unseen; the test split uses the train
    vocabulary. Categories are hexadecimal numbers of 1 to 15 digits (case does not matter). With --like
    CHECKPOINT, the next day is written on the model's vocabularies (extended by its new values) for
    `train --continue-from CHECKPOINT`.
    """
    from ctrkit.preprocess.criteo import CriteoRecipe

    cfg: CriteoPreprocessConfig = config_from(args, CriteoPreprocessConfig)
    kwargs = dict(
        test_files=cfg.test_files,
        test_fraction=None if cfg.test_files is not None else (0.1 if cfg.test_fraction is None else cfg.test_fraction),
        validation_fraction=cfg.validation_fraction,
        bad_rows=cfg.bad_rows,
        overwrite=cfg.overwrite,
        progress=not cfg.no_progress,
    )
    raw_ids = tuple(f"C{i}" for i in range(1, 27)) if cfg.raw_ids == ("all",) else cfg.raw_ids
    recipe = CriteoRecipe(frequency_threshold=cfg.frequency_threshold, raw_ids=raw_ids, capacity=cfg.capacity)
    if cfg.like is not None:
        if cfg.raw_ids or cfg.capacity is not None:
            raise ValueError("--raw-ids, --capacity: with --like the raw-id columns and their tables are the model's; "
                             "leave them out")  # fmt: skip
        kwargs["like"] = _like(cfg.like)
    if cfg.engine == "spark":
        from ctrkit.preprocess.spark_engine import preprocess_criteo_spark

        summary = preprocess_criteo_spark(cfg.raw, cfg.out, recipe, master=cfg.spark_master, **kwargs)
    else:
        from ctrkit.preprocess.polars_engine import preprocess_criteo

        summary = preprocess_criteo(cfg.raw, cfg.out, recipe, **kwargs)
    cards = list(summary["cardinalities"].values())
    validation = f" + {summary['validation_rows']:,} validation" if "validation_rows" in summary else ""
    print(
        f"wrote {cfg.out}: {summary['train_rows']:,} train{validation} + {summary['test_rows']:,} test rows, "
        f"{summary['bad_rows']:,} bad rows dropped, cardinalities {min(cards)}..{max(cards)}, "
        f"{summary['seconds']:.1f} s"
    )
    return 0


def preprocess_outbrain(args: argparse.Namespace) -> int:
    """the raw Kaggle Outbrain files -> a Wide & Deep dataset with MAP@12 groups

    Joins clicks_train.csv with events, promoted_content and documents_meta; features as NVIDIA's Wide &
    Deep workflow defines them: 13 one-hot (documents, sources, publishers, platform, geo location /
    country / state, ad, advertiser, campaign), 6 multi-hot (the 3 most confident topics, entities and
    categories of the page's and the ad's documents), 15 numerical (training CTRs of ad, advertiser,
    campaign and the ad's document, source and publisher, a training row's over the other --ctr-folds
    folds of training displays; training impressions; days since published;
    tf-idf similarities of the two documents; page views, streamed from page_views.csv). Split per display:
    a random 80% of days 0-10 train, the rest is the test mapping (by display, display id as the map
    channel). Vocabularies and statistics come from the training rows only. clicks_train.csv is read and
    worked on in blocks (--block-rows): memory follows the other files, plus 9 bytes a clicks row.
    """
    from ctrkit.preprocess.outbrain import preprocess_outbrain as run
    from ctrkit.preprocess.outbrain_files import OutbrainRecipe

    cfg: OutbrainPreprocessConfig = config_from(args, OutbrainPreprocessConfig)
    if cfg.raw is None:
        raise ValueError("`raw`: give the directory of the raw Outbrain files")
    recipe = OutbrainRecipe(frequency_threshold=cfg.frequency_threshold, seed=cfg.seed, bad_rows=cfg.bad_rows,
                            ctr_folds=cfg.ctr_folds, raw_ids=cfg.raw_ids, capacity=cfg.capacity)  # fmt: skip
    summary = run(cfg.raw, cfg.out, recipe, overwrite=cfg.overwrite, progress=not cfg.no_progress,
                  engine=cfg.engine, master=cfg.spark_master, block_rows=cfg.block_rows)  # fmt: skip
    print(
        f"wrote {cfg.out}: {summary['rows']['train']:,} train + {summary['rows']['test']:,} test rows, "
        f"{summary['bad_rows']:,} bad rows dropped, {summary['seconds']:.1f} s "
        f"({summary['clicks_rows_per_second']:,} clicks rows/s)"
    )
    return 0


def _like(path):
    """``--like``: the preprocessing a checkpoint (a file) or a dataset (a directory) carries (``Like``)."""
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        from ctrkit.preprocess.like import Like

        return Like.of_dataset(path)
    if not path.is_file():
        raise ValueError(f"--like {path}: no such checkpoint or dataset directory")
    from ctrkit.checkpoint import load_checkpoint

    return load_checkpoint(path, mmap=True, assemble=False).like(str(path))


def preprocess_table(args: argparse.Namespace) -> int:
    """a CSV or Parquet table with a header, one row per impression -> a dataset

    Columns named by a flag get that role; the others by type: text and booleans categorical, floats
    numerical, Parquet lists multi-hot; integer columns must be named (ids or amounts?), and an unnamed
    first column (a row index) is dropped. Categorical values get ids as the Criteo recipe gives them (0
    missing or unseen in train, 1 rarer than --frequency-threshold in train, 2.. by descending train count);
    numerical values are kept as float32 (missing -> 0; the models standardise them), and those whose exact
    values predict the label on held-out training rows beyond what the table's other columns say (a
    household's repeated amounts) are also given as ids, <column>_id (--also-categorical); a timestamp is read as
    the hour of the day and the day of the week, <column>_hour and <column>_weekday (--time). The rows keep the
    files' order (taken as time order) unless --order-by or --shuffle-seed; the test split is the last
    --test-fraction of them or --test-files. The table is held in memory, or with --engine spark in Apache
    Spark's parts (the same dataset, byte for byte). A CSV record with more or fewer fields
    than the header, a stray quote or bytes that are not UTF-8 is refused naming its line; blank lines are skipped.
    With --like CHECKPOINT, a later day is written with the model's preprocessing instead: its values keep their
    ids, new values get ids after them, and `train --continue-from CHECKPOINT` grows the tables for them.
    """
    from ctrkit.preprocess.table import preprocess_table as run
    from ctrkit.preprocess.table_recipe import recipe_of

    cfg: TablePreprocessConfig = config_from(args, TablePreprocessConfig)
    recipe = recipe_of(cfg)
    test_fraction = None if cfg.test_files is not None else (0.1 if cfg.test_fraction is None else cfg.test_fraction)
    summary = run(cfg.raw, cfg.out, recipe, test_files=cfg.test_files, test_fraction=test_fraction,
                  validation_fraction=cfg.validation_fraction, overwrite=cfg.overwrite,
                  progress=not cfg.no_progress, like=_like(cfg.like) if cfg.like is not None else None,
                  engine=cfg.engine, master=cfg.spark_master)  # fmt: skip
    roles = [
        ("label", [summary["label"]]),
        ("order", [summary.get("order_by")]),
        ("time", [f"{c} ({', '.join(t['parts'])})" for c, t in summary.get("time", {}).items()]),
        ("group", [summary.get("group")]),
        ("categorical", summary["categorical"]),
        ("raw ids", summary["raw_ids"]),
        ("numerical", summary["numerical"]),
        ("multi-hot", summary["multi_hot"]),
        ("dropped", summary["dropped"]),
    ]
    print("columns: " + "; ".join(f"{role} {', '.join(c for c in names if c)}" for role, names in roles
                                  if any(names)))  # fmt: skip
    pooled = summary.get("pooling_tests", {})
    if pooled:
        print("multi-hot pooling (--combiner auto): " + ", ".join(
            f"{c} {t['chosen']} (held-out log loss sum {t['sum']:.4f}, mean {t['mean']:.4f})" if t.get("tested", True)
            else f"{c} {t['chosen']} (not tested: {t['held_out']:,} held-out rows, the test needs {MIN_HELD_OUT})"
            for c, t in pooled.items()))  # fmt: skip
    tests = summary.get("value_id_tests", {})
    if tests:
        chosen = [f"{c} (-{t['gain']:.4f} log loss)" for c, t in tests.items() if t["chosen"]]
        print(f"also as ids (--also-categorical auto): {', '.join(chosen) if chosen else 'no column'} "
              f"of {len(tests)} numerical tested")  # fmt: skip
    validation = f" + {summary['validation_rows']:,} validation" if "validation_rows" in summary else ""
    print(
        f"wrote {cfg.out}: {summary['train_rows']:,} train{validation} + {summary['test_rows']:,} test rows, "
        f"{summary['bad_rows']:,} bad rows dropped; {len(summary['categorical'])} categorical, "
        f"{len(summary['multi_hot'])} multi-hot, {len(summary['numerical'])} numerical features, "
        f"{summary['seconds']:.1f} s"
    )
    return 0


def transcode(args: argparse.Namespace) -> int:
    """CSV/Parquet + feature_spec.yaml -> split binary

    Converts a dataset whose feature_spec.yaml describes CSV (headerless, one column per feature in the
    chunk's order) or Parquet chunks into split binary with a new feature_spec.yaml; 'cardinality: auto'
    is inferred as the largest id + 1.
    """
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.data.transcode import transcode as run_transcode

    cfg: TranscodeConfig = config_from(args, TranscodeConfig)
    spec = run_transcode(cfg.input, cfg.output, overwrite=cfg.overwrite, chunk_size=cfg.chunk_size)
    sizes = {m: len(SplitBinaryDataset(spec, m, check_ids=False)) for m in spec.source_spec}
    print(
        f"wrote {cfg.output}: " + ", ".join(f"{n:,} {m}" for m, n in sizes.items()) + f" rows; cardinalities "
        f"{dict(zip(spec.categorical_features, spec.cardinalities))}"
    )
    return 0


def gen_csv(args: argparse.Namespace) -> int:
    """random CSV data matching a CSV-type feature spec

    Writes the CSV files a feature spec's source_spec names, with ids in range and labels of both classes,
    plus a copy of the spec, for trying `ctrkit transcode`.
    """
    from ctrkit.data.transcode import generate_csv

    cfg: GenCsvConfig = config_from(args, GenCsvConfig)
    out = generate_csv(cfg.feature_spec, cfg.out, cfg.rows, cfg.seed)
    print(f"wrote {out}: {cfg.rows} rows per mapping as CSV, and feature_spec.yaml")
    return 0
