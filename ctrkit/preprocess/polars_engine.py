"""The Criteo recipe on Polars, the embedded default engine."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.data.atomic import atomic_directory
from ctrkit.data.feature_spec import FeatureSpec, criteo_like_spec
from ctrkit.data.split_binary import DataError, SplitBinaryWriter
from ctrkit.preprocess.criteo import FIRST_ID, MISSING_ID, RARE_ID, CriteoRecipe

BAD_ROW_POLICIES = ("error", "skip")
REJECTS_KEPT = 20
WRITE_ROWS = 1 << 20


def _read_lines(path: Path) -> pl.DataFrame:
    """One string per input line (plain or gzipped), with its file and 1-based line number."""
    if not path.exists():
        raise ValueError(f"{path}: input file not found")
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: input file is empty")
    df = pl.read_csv(path, separator="\x1f", has_header=False, quote_char=None, schema={"line": pl.String})
    return df.with_row_index("line_no", offset=1).with_columns(pl.lit(str(path)).alias("file"))


def _parse(lines: pl.DataFrame, recipe: CriteoRecipe) -> pl.DataFrame:
    """Splits lines into named string fields and a ``problem`` column (null for a good row)."""
    names = [recipe.field_name(i) for i in range(recipe.num_fields)]
    fields = pl.col("line").str.split("\t")
    df = lines.with_columns(fields.alias("_fields"), fields.list.len().fill_null(0).alias("_n"))
    df = df.with_columns([pl.col("_fields").list.get(i, null_on_oob=True).alias(n) for i, n in enumerate(names)])
    return _validate(df, recipe, field_count="_n").drop("_fields", "_n")


def _validate(df: pl.DataFrame, recipe: CriteoRecipe, field_count: str | None = None) -> pl.DataFrame:
    """Adds ``problem``: what is wrong with each row (null for a good one), first problem first."""
    names = [recipe.field_name(i) for i in range(recipe.num_fields)]
    checks = (
        []
        if field_count is None
        else [
            pl.when(pl.col(field_count) != recipe.num_fields).then(
                pl.format(f"expected {recipe.num_fields} tab-separated fields, found {{}}", pl.col(field_count))
            ),
        ]
    )
    checks.append(
        pl.when(~pl.col("label").is_in(["0", "1"])).then(pl.format("label must be 0 or 1, got '{}'", pl.col("label")))
    )
    for n in names[1 : 1 + recipe.num_numerical]:
        bad = (pl.col(n) != "") & pl.col(n).cast(pl.Int64, strict=False).is_null()
        checks.append(pl.when(bad).then(pl.format(f"{n}: '{{}}' is not an integer", pl.col(n))))
    for n in names[1 + recipe.num_numerical :]:
        bad = (pl.col(n) != "") & ~pl.col(n).str.contains(r"^[0-9a-fA-F]+$")
        checks.append(pl.when(bad).then(pl.format(f"{n}: '{{}}' is not a hexadecimal category", pl.col(n))))
    return df.with_columns(pl.coalesce(checks).alias("problem"))


def _fast_parse(path: Path, recipe: CriteoRecipe) -> pl.DataFrame | None:
    """Polars' own tab parser, when every line has exactly the recipe's field count; else None.

    The native reader is several times faster than splitting lines, but it cannot tell a missing
    trailing field from an empty one, so a tab count over the raw lines vouches for the file first;
    any doubt sends the file down the line-by-line path, which names the bad line.
    """
    lines = _read_lines(path)
    tabs = lines.select(pl.col("line").str.count_matches("\t", literal=True).fill_null(-1).alias("tabs"))["tabs"]
    if len(lines) == 0 or (tabs != recipe.num_fields - 1).any():
        return None
    names = [recipe.field_name(i) for i in range(recipe.num_fields)]
    try:
        df = pl.read_csv(
            path,
            separator="\t",
            has_header=False,
            schema=dict.fromkeys(names, pl.String),
            quote_char=None,
            empty_string_is_null=False,
        )
    except pl.exceptions.PolarsError:
        return None
    if len(df) != len(lines):
        return None
    return df.with_row_index("line_no", offset=1).with_columns(
        pl.lit(str(path)).alias("file"), pl.lit(None, dtype=pl.String).alias("line")
    )


def _load(files: Sequence[Path], recipe: CriteoRecipe, bad_rows: str, rejects: list[dict]) -> tuple[pl.DataFrame, int]:
    """Parsed good rows of ``files`` in order, and the number of bad rows dropped."""
    frames, dropped = [], 0
    for path in files:
        fast = _fast_parse(Path(path), recipe)
        if fast is not None:
            df = _validate(fast, recipe)
            if df["problem"].null_count() != len(df):  # a bad value: redo slowly, with the raw line for rejects
                df = _parse(_read_lines(Path(path)), recipe)
        else:
            df = _parse(_read_lines(Path(path)), recipe)
        bad = df.filter(pl.col("problem").is_not_null())
        if len(bad):
            first = bad.row(0, named=True)
            if bad_rows == "error":
                raise DataError(
                    f"{first['file']}:{first['line_no']}: {first['problem']} (pass --bad-rows skip to drop bad rows)"
                )
            dropped += len(bad)
            room = REJECTS_KEPT - len(rejects)
            if room > 0:
                rejects.extend(bad.head(room).select("file", "line_no", "problem", "line").to_dicts())
            df = df.filter(pl.col("problem").is_null())
        frames.append(df.drop("problem", "line"))
    return pl.concat(frames), dropped


def build_vocabulary(train: pl.DataFrame, column: str, frequency_threshold: int) -> pl.DataFrame:
    """(value, count, id) of every value of ``column`` in the train split, ids as the recipe says."""
    values = train.select(pl.col(column).alias("value")).filter(pl.col("value") != "")  # one column, not the frame
    counts = values.group_by("value").len("count")
    frequent = (
        counts.filter(pl.col("count") >= frequency_threshold)
        .sort(["count", "value"], descending=[True, False])
        .with_row_index("id", offset=FIRST_ID)
    )
    rare = counts.filter(pl.col("count") < frequency_threshold).sort("value").with_columns(pl.lit(RARE_ID).alias("id"))
    return pl.concat(
        [
            frequent.select("value", "count", pl.col("id").cast(pl.Int64)),
            rare.select("value", "count", pl.col("id").cast(pl.Int64)),
        ]
    )


def _encode(df: pl.DataFrame, recipe: CriteoRecipe, vocabularies: list[pl.DataFrame]) -> tuple[np.ndarray, ...]:
    """(numerical (N, n_num) float64, categorical (N, n_cat) int64, labels (N,) uint8)."""
    nums = [recipe.field_name(i) for i in range(1, 1 + recipe.num_numerical)]
    cats = [recipe.field_name(i) for i in range(1 + recipe.num_numerical, recipe.num_fields)]
    numerical = df.select(
        [
            ((pl.max_horizontal(pl.col(n).cast(pl.Int64, strict=False), pl.lit(-2)) + 3).log()).fill_null(0.0).alias(n)
            for n in nums
        ]
    ).to_numpy()
    categorical = df.select(
        [
            pl.col(c).replace_strict(v["value"], v["id"], default=MISSING_ID, return_dtype=pl.Int64).alias(c)
            for c, v in zip(cats, vocabularies)
        ]
    ).to_numpy()
    labels = df["label"].cast(pl.UInt8).to_numpy()
    return numerical.reshape(len(df), len(nums)), categorical, labels


def preprocess_criteo(
    raw_files: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    recipe: CriteoRecipe | None = None,
    test_files: Sequence[str | os.PathLike] | None = None,
    test_fraction: float | None = None,
    bad_rows: str = "error",
    overwrite: bool = False,
) -> dict:
    """Raw Criteo TSV -> a split-binary dataset with ``train`` and ``test`` mappings.

    Args:
        raw_files: training input (plain or .gz), in order.
        out_dir: dataset directory to create; it appears only when complete.
        recipe: the recipe's parameters (frequency threshold, column counts); default CriteoRecipe().
        test_files: files of the test split; if None, the last ``test_fraction`` of the rows of
            ``raw_files`` (in order) is the test split.
        test_fraction: see ``test_files``.
        bad_rows: "error" (default: stop at the first bad row, naming file and line) or "skip"
            (drop, count, and keep the first 20 in ``rejects.jsonl``).
        overwrite: replace an existing dataset directory.

    Returns:
        The summary also written to ``summary.json``: rows per split, bad rows, cardinalities, seconds.
    """
    recipe = recipe or CriteoRecipe()
    recipe.validate()
    if bad_rows not in BAD_ROW_POLICIES:
        raise ValueError(f"--bad-rows must be one of {', '.join(BAD_ROW_POLICIES)}, got {bad_rows!r}")
    if not raw_files:
        raise ValueError("no input files given")
    if (test_files is None) == (test_fraction is None):
        raise ValueError("give exactly one of --test-files and --test-fraction")
    if test_fraction is not None and not 0.0 < test_fraction < 1.0:
        raise ValueError(f"--test-fraction must lie in (0, 1), got {test_fraction}")
    start = time.perf_counter()
    rejects: list[dict] = []
    rows, dropped = _load([Path(p) for p in raw_files], recipe, bad_rows, rejects)
    if test_files is not None:
        train = rows
        test, dropped_test = _load([Path(p) for p in test_files], recipe, bad_rows, rejects)
        dropped += dropped_test
    else:
        n_test = int(round(len(rows) * test_fraction))
        train, test = rows.head(len(rows) - n_test), rows.tail(n_test)
    if len(train) == 0 or len(test) == 0:
        raise ValueError(f"the split left {len(train)} train and {len(test)} test rows; both need at least one")

    cats = [recipe.field_name(i) for i in range(1 + recipe.num_numerical, recipe.num_fields)]
    vocabularies = [build_vocabulary(train, c, recipe.frequency_threshold) for c in cats]
    cardinalities = [FIRST_ID + int((v["id"] >= FIRST_ID).sum()) for v in vocabularies]
    with atomic_directory(out_dir, overwrite) as tmp:
        base = criteo_like_spec(cardinalities, recipe.num_numerical)
        meta = {
            "preprocessed_by": "ctrkit preprocess criteo",
            "engine": "polars",
            "frequency_threshold": recipe.frequency_threshold,
            "missing_id": MISSING_ID,
            "rare_id": RARE_ID,
        }
        spec = FeatureSpec(base.feature_spec, base.source_spec, base.channel_spec, meta, tmp)
        for mapping, df in (("train", train), ("test", test)):
            with SplitBinaryWriter(spec, mapping) as writer:
                for lo in range(0, len(df), WRITE_ROWS):
                    writer.append(*_encode(df.slice(lo, WRITE_ROWS), recipe, vocabularies))
        spec.to_yaml(tmp / "feature_spec.yaml")
        (tmp / "vocab").mkdir()
        for c, v in zip(cats, vocabularies):
            v.write_parquet(tmp / "vocab" / f"{c}.parquet")
        if rejects:
            with open(tmp / "rejects.jsonl", "w") as f:
                for r in rejects:
                    f.write(json.dumps(r) + "\n")
        summary = {
            "engine": "polars",
            "train_rows": len(train),
            "test_rows": len(test),
            "bad_rows": dropped,
            "cardinalities": dict(zip(cats, cardinalities)),
            "frequency_threshold": recipe.frequency_threshold,
            "seconds": round(time.perf_counter() - start, 3),
        }
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
