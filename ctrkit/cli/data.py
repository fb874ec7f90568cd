"""Data commands: synth, preprocess, transcode, gen-csv."""

from __future__ import annotations

import argparse
from pathlib import Path

from ctrkit.cli.options import add_no_progress, add_overwrite, add_seed, int_list

# heavy modules (torch above all, ~1.2 s) are imported by the handlers that use them, so that
# `ctrkit preprocess` and `ctrkit --help` start quickly


def register(sub: argparse._SubParsersAction) -> None:
    _synth(sub)
    _preprocess(sub)
    _transcode(sub)
    _gen_csv(sub)


def _synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth",
        help="write synthetic data: a Criteo-like or Outbrain-like dataset, or raw Criteo TSV",
        description="criteo-like (default): train/ and test/ split-binary mappings with power-law ids and a "
        "planted click signal (per-id effects, pairwise latent interactions, nonlinear numerical effects). "
        "outbrain: displays of 2-12 ads with one click each, multi-hot topics and display ids for MAP@12. "
        "criteo: the same click model as raw Criteo-format TSV, for `ctrkit preprocess criteo`.",
    )
    p.add_argument(
        "kind",
        nargs="?",
        choices=("criteo-like", "outbrain", "criteo"),
        default="criteo-like",
        help="criteo-like (default): a split-binary dataset of 13 numerical + 26 categorical features; "
        "outbrain: displays of 2-12 ads with one click each, request- and item-level features, two multi-hot, "
        "display ids for MAP@12; criteo: raw Criteo-format TSV (--out names a file; .gz to compress)",
    )
    p.add_argument("--out", required=True, type=Path, help="dataset directory to create (a file for criteo)")
    p.add_argument("--rows", type=int, default=300_000, help="about this many samples, train + test (default 300000)")
    p.add_argument(
        "--tables",
        type=int_list,
        default=None,
        help="comma-separated cardinalities of the categorical features (default: 26 Criteo-like "
        "tables of 3 to 200,000 rows)",
    )
    p.add_argument("--num-numerical", type=int, default=13, help="numerical features (default 13)")
    p.add_argument("--test-fraction", type=float, default=0.1, help="share of rows in test/ (default 0.1)")
    add_seed(p, "random seed of the click model and samples")
    add_overwrite(p, "an existing dataset directory")
    p.set_defaults(handler=synth)


def synth(args: argparse.Namespace) -> int:
    import numpy as np

    from ctrkit.data.dataset import SplitBinaryDataset

    if args.kind == "criteo":
        from ctrkit.data.synthetic import CRITEO_LIKE_CARDINALITIES, write_criteo_tsv

        tables = args.tables or CRITEO_LIKE_CARDINALITIES
        out = write_criteo_tsv(args.out, args.rows, tables, args.num_numerical, args.seed, overwrite=args.overwrite)
        print(f"wrote {out}: {args.rows} raw rows (label, {args.num_numerical} integer, {len(tables)} hashed columns)")
        return 0
    if args.kind == "outbrain":
        from ctrkit.data.synthetic_outbrain import generate_outbrain

        if args.tables is not None or args.num_numerical != 13:
            raise ValueError("--tables and --num-numerical apply to the criteo-like dataset only")
        spec = generate_outbrain(args.out, args.rows, args.test_fraction, args.seed, overwrite=args.overwrite)
        test = SplitBinaryDataset(spec, "test", check_ids=False)
        n_train = len(SplitBinaryDataset(spec, "train", check_ids=False))
        print(
            f"wrote {args.out}: {n_train} train + {len(test)} test rows, {len(np.unique(test.groups()))} test "
            f"displays; {len(spec.onehot_features)} one-hot + {len(spec.multi_hot_features)} multi-hot categorical, "
            f"{len(spec.numerical_features)} numerical features"
        )
        return 0
    from ctrkit.data.synthetic import CRITEO_LIKE_CARDINALITIES, generate_dataset

    tables = args.tables or CRITEO_LIKE_CARDINALITIES
    spec = generate_dataset(
        args.out, args.rows, tables, args.num_numerical, args.test_fraction, args.seed, overwrite=args.overwrite
    )
    n_train = len(SplitBinaryDataset(spec, "train", check_ids=False))
    n_test = len(SplitBinaryDataset(spec, "test", check_ids=False))
    print(
        f"wrote {args.out}: {n_train} train + {n_test} test samples, {len(tables)} categorical "
        f"(cardinalities {min(tables)}..{max(tables)}), {args.num_numerical} numerical features"
    )
    return 0


def _preprocess(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "preprocess",
        help="raw click logs -> a split-binary dataset",
        description="Runs a preprocessing recipe on raw logs and writes a ctrkit dataset (split binary + "
        "feature_spec.yaml), the vocabularies (vocab/<column>.parquet: value, count, id) and summary.json.",
    )
    psub = p.add_subparsers(dest="recipe", required=True, metavar="{criteo}", help="the raw format and its recipe")
    c = psub.add_parser(
        "criteo",
        help="Criteo TSV: label, 13 integers, 26 hashed categories",
        description="Criteo recipe: integers x -> log(max(x, -2) + 3), missing -> 0; categories seen fewer than "
        "--frequency-threshold times in the train split share the rare id 1, the others get ids from 2 by "
        "descending frequency (ties by value), id 0 is missing/unseen; the test split uses the train "
        "vocabulary. Categories are hexadecimal numbers of 1 to 15 digits (case does not matter).",
    )
    c.add_argument("raw", nargs="+", type=Path, help="raw TSV files (plain or .gz) of the train split, in order")
    c.add_argument("--out", required=True, type=Path, help="dataset directory to create")
    split = c.add_mutually_exclusive_group()
    split.add_argument("--test-files", nargs="+", type=Path, default=None, help="raw files of the test split")
    split.add_argument(
        "--test-fraction", type=float, default=None, help="last fraction of the rows as the test split (default 0.1)"
    )
    c.add_argument("--frequency-threshold", type=int, default=3, help="FL: rarer categories share one id (default 3)")
    c.add_argument(
        "--bad-rows",
        choices=("error", "skip"),
        default="error",
        help="error (default): stop at the first malformed row, naming file and line; skip: drop and count "
        "them, keeping the first 20 in rejects.jsonl",
    )
    c.add_argument(
        "--engine",
        choices=("polars", "spark"),
        default="polars",
        help="polars (default): embedded, streaming, memory bounded; spark: Apache Spark (pip install "
        "'ctrkit[spark]'), for data that outgrows one machine. Both write byte-identical datasets",
    )
    c.add_argument(
        "--spark-master",
        default="local[*]",
        help="Spark master URL for --engine spark (default local[*]: all cores of this machine)",
    )
    add_overwrite(c, "an existing dataset directory")
    add_no_progress(c, "no progress bars")
    c.set_defaults(handler=preprocess)


def preprocess(args: argparse.Namespace) -> int:
    from ctrkit.preprocess.criteo import CriteoRecipe

    test_fraction = args.test_fraction if args.test_fraction is not None else 0.1
    kwargs = dict(
        test_files=args.test_files,
        test_fraction=None if args.test_files is not None else test_fraction,
        bad_rows=args.bad_rows,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    recipe = CriteoRecipe(frequency_threshold=args.frequency_threshold)
    if args.engine == "spark":
        from ctrkit.preprocess.spark_engine import preprocess_criteo_spark

        summary = preprocess_criteo_spark(args.raw, args.out, recipe, master=args.spark_master, **kwargs)
    else:
        from ctrkit.preprocess.polars_engine import preprocess_criteo

        summary = preprocess_criteo(args.raw, args.out, recipe, **kwargs)
    cards = list(summary["cardinalities"].values())
    print(
        f"wrote {args.out}: {summary['train_rows']:,} train + {summary['test_rows']:,} test rows, "
        f"{summary['bad_rows']:,} bad rows dropped, cardinalities {min(cards)}..{max(cards)}, "
        f"{summary['seconds']:.1f} s"
    )
    return 0


def _transcode(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser(
        "transcode",
        help="CSV/Parquet + feature_spec.yaml -> split binary",
        description="Converts a dataset whose feature_spec.yaml describes CSV (headerless, one column per feature "
        "in the chunk's order) or Parquet chunks into split binary with a new feature_spec.yaml; "
        "'cardinality: auto' is inferred as the largest id + 1.",
    )
    t.add_argument("--input", required=True, type=Path, help="directory holding feature_spec.yaml and the data")
    t.add_argument("--output", required=True, type=Path, help="dataset directory to create")
    add_overwrite(t, "an existing output directory")
    t.add_argument(
        "--chunk-size",
        type=int,
        default=1 << 20,
        help="rows read and written at a time; memory stays bounded by it, not by the data (default 1048576)",
    )
    t.set_defaults(handler=transcode)


def transcode(args: argparse.Namespace) -> int:
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.data.transcode import transcode as run_transcode

    spec = run_transcode(args.input, args.output, overwrite=args.overwrite, chunk_size=args.chunk_size)
    sizes = {m: len(SplitBinaryDataset(spec, m, check_ids=False)) for m in spec.source_spec}
    print(
        f"wrote {args.output}: " + ", ".join(f"{n:,} {m}" for m, n in sizes.items()) + f" rows; cardinalities "
        f"{dict(zip(spec.categorical_features, spec.cardinalities))}"
    )
    return 0


def _gen_csv(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser(
        "gen-csv",
        help="random CSV data matching a CSV-type feature spec",
        description="Writes the CSV files a feature spec's source_spec names, with ids in range and labels of "
        "both classes, plus a copy of the spec, for trying `ctrkit transcode`.",
    )
    g.add_argument("--feature-spec", required=True, type=Path, help="a feature_spec.yaml with csv chunks")
    g.add_argument("--out", required=True, type=Path, help="directory for the CSV files and the spec")
    g.add_argument("--rows", type=int, default=1000, help="rows per mapping (default 1000)")
    add_seed(g)
    g.set_defaults(handler=gen_csv)


def gen_csv(args: argparse.Namespace) -> int:
    from ctrkit.data.transcode import generate_csv

    out = generate_csv(args.feature_spec, args.out, args.rows, args.seed)
    print(f"wrote {out}: {args.rows} rows per mapping as CSV, and feature_spec.yaml")
    return 0
