"""The Criteo recipe on Polars, the embedded default engine: streaming, memory bounded.

Pass 1 reads the input in blocks of whole lines (~24 MB), parses and validates each block, and
appends its labels, transformed numerical values and categorical keys to temporary column files.
Pass 2 counts the train split's keys, builds the vocabularies, and maps the keys to ids block by
block into the split-binary dataset. Peak memory is a few blocks plus the vocabularies, whatever the
number of rows.
"""

from __future__ import annotations

import gzip
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import polars as pl
from tqdm import tqdm

from ctrkit.data.prefetch import prefetched
from ctrkit.preprocess import vocabulary as vocab_mod
from ctrkit.preprocess.criteo import CriteoRecipe, check_arguments, numerical_transform
from ctrkit.preprocess.output import DatasetOutput, Rejects

BLOCK_BYTES = 24 << 20  # under glibc's mmap threshold, so block buffers are reused, not page-faulted anew
PASS2_ROWS = 1 << 18  # rows per pass-2 block: keys, joins and ids of 26 columns stay well under 1 GB


def _open(path: Path):
    if not path.exists():
        raise ValueError(f"{path}: input file not found")
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def read_blocks(path: Path, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[bytes, int, int]]:
    """Blocks of whole lines of ``path`` (plain or gzip), each with the 1-based number of its first line
    and its number of lines (counted once, here, on the reading thread).

    Every block ends with a newline (one is added after a last line that lacks it).
    """
    line, rest, empty = 1, b"", True
    with _open(path) as f:
        while data := f.read(block_bytes):
            empty = False
            data = rest + data if rest else data
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            block, rest = (data, b"") if cut == len(data) else (data[:cut], data[cut:])
            lines = block.count(b"\n")
            yield block, line, lines
            line += lines
    if empty:
        raise ValueError(f"{path}: input file is empty")
    if rest:
        yield rest + b"\n", line, rest.count(b"\n") + 1


class _Parser:
    """Parses blocks into typed frames of good rows; bad rows are raised or handed to ``rejects``."""

    def __init__(self, recipe: CriteoRecipe, rejects: Rejects):
        self.recipe = recipe
        self.rejects = rejects
        self.names = [recipe.field_name(i) for i in range(recipe.num_fields)]
        self.nums = self.names[1 : 1 + recipe.num_numerical]
        self.cats = self.names[1 + recipe.num_numerical :]
        self.typed = {"label": pl.UInt8, **dict.fromkeys(self.nums, pl.Int64), **dict.fromkeys(self.cats, pl.String)}

    def parse(self, block: bytes, path: Path, first_line: int, lines: int) -> pl.DataFrame:
        """Good rows of ``block`` (``lines`` lines) as (label UInt8, numerical Int64, categorical keys Int64)."""
        df = self._fast(block, lines)
        if df is not None:
            keyed = df.select("label", *self.nums, *[vocab_mod.key_expr(c).alias(c) for c in self.cats])
            if not any(keyed[c].has_nulls() for c in self.cats):
                return keyed
        return self._slow(block, path, first_line)

    def _fast(self, block: bytes, lines: int) -> pl.DataFrame | None:
        """Polars' own typed tab parser, when the block's tab count vouches for every line; else None.

        The native reader is several times faster than splitting lines, but it reads a missing trailing
        field as an empty one. It refuses a line with too many fields, so a total of exactly
        ``fields - 1`` tabs per line means every line has them all.
        """
        if block.count(b"\t") != lines * (self.recipe.num_fields - 1):
            return None
        try:
            df = pl.read_csv(
                block,
                separator="\t",
                has_header=False,
                schema=self.typed,
                quote_char=None,
                empty_string_is_null=False,
            )
        except pl.exceptions.PolarsError:
            return None  # a non-integer, a bad label, ...: the slow path names the line
        if len(df) != lines or df["label"].has_nulls() or (df["label"].max() or 0) > 1:
            return None
        return df

    def _slow(self, block: bytes, path: Path, first_line: int) -> pl.DataFrame:
        """Line by line: every row checked, the first problem of each bad row named."""
        text = pl.Series("line", block.decode("utf-8", errors="replace").split("\n")[:-1], dtype=pl.String)
        fields = pl.col("line").str.split("\t")
        df = text.to_frame().with_columns(fields.list.len().alias("_n"))
        df = df.with_columns([fields.list.get(i, null_on_oob=True).alias(n) for i, n in enumerate(self.names)])
        df = df.with_columns([vocab_mod.key_expr(c).alias(f"_key_{c}") for c in self.cats])
        checks = [
            pl.when(pl.col("_n") != self.recipe.num_fields).then(
                pl.format(f"expected {self.recipe.num_fields} tab-separated fields, found {{}}", pl.col("_n"))
            ),
            pl.when(~pl.col("label").is_in(["0", "1"])).then(
                pl.format("label must be 0 or 1, got '{}'", pl.col("label"))
            ),
        ]
        for n in self.nums:
            bad = (pl.col(n) != "") & pl.col(n).cast(pl.Int64, strict=False).is_null()
            checks.append(pl.when(bad).then(pl.format(f"{n}: '{{}}' is not an integer", pl.col(n))))
        for c in self.cats:
            checks.append(
                pl.when(pl.col(f"_key_{c}").is_null()).then(
                    pl.format(f"{c}: '{{}}' is not a hexadecimal category (1 to 15 digits)", pl.col(c))
                )
            )
        df = df.with_row_index("line_no", offset=first_line).with_columns(pl.coalesce(checks).alias("problem"))
        bad = df.filter(pl.col("problem").is_not_null())
        if len(bad):
            self.rejects.add(str(path), bad.select("line_no", "problem", "line").rows())
        good = df.filter(pl.col("problem").is_null())
        return good.select(
            pl.col("label").cast(pl.UInt8),
            *[pl.col(n).cast(pl.Int64, strict=False) for n in self.nums],
            *[pl.col(f"_key_{c}").alias(c) for c in self.cats],
        )


class _ColumnFiles:
    """Temporary per-column files of pass 1: labels, numerical block, one key file per category."""

    def __init__(self, directory: Path, recipe: CriteoRecipe):
        directory.mkdir()
        self.recipe = recipe
        self.label = directory / "label.u8"
        self.numerical = directory / "numerical.f16"
        self.keys = [directory / f"key_{j}.i64" for j in range(recipe.num_categorical)]
        self._files = [open(p, "wb") for p in (self.label, self.numerical, *self.keys)]
        self.rows = 0

    def append(self, df: pl.DataFrame, parser: _Parser) -> None:
        label_f, num_f, *key_f = self._files
        label_f.write(df["label"].to_numpy().tobytes())
        if parser.nums:
            ints = df.select([pl.col(n).fill_null(-2) for n in parser.nums]).to_numpy()
            num_f.write(numerical_transform(ints).tobytes())
        for f, c in zip(key_f, parser.cats):
            f.write(df[c].to_numpy().astype(np.int64, copy=False).tobytes())
        self.rows += len(df)

    def close(self) -> None:
        for f in self._files:
            f.close()

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Rows [lo, hi): labels (n,), numerical (n, n_num) float16, keys per category (n,)."""
        n, width = hi - lo, self.recipe.num_numerical
        labels = np.fromfile(self.label, np.uint8, n, offset=lo)
        numerical = np.fromfile(self.numerical, np.float16, n * width, offset=lo * width * 2).reshape(n, width)
        keys = [np.fromfile(p, np.int64, n, offset=lo * 8) for p in self.keys]
        return labels, numerical, keys


class _Counts:
    """Running (key, count) per category, merged every few blocks to keep the partial tables few."""

    MERGE_EVERY = 16

    def __init__(self, num_categorical: int):
        self.parts: list[list[pl.DataFrame]] = [[] for _ in range(num_categorical)]

    def add(self, keys: Sequence[pl.Series]) -> None:
        counted = pl.collect_all([k.alias("key").to_frame().lazy().group_by("key").len("count") for k in keys])
        for parts, c in zip(self.parts, counted):
            parts.append(c.with_columns(pl.col("count").cast(pl.Int64)))
            if len(parts) >= self.MERGE_EVERY:
                parts[:] = [self._merge(parts)]

    @staticmethod
    def _merge(parts: list[pl.DataFrame]) -> pl.DataFrame:
        return pl.concat(parts).group_by("key").agg(pl.col("count").sum())

    def totals(self) -> list[pl.DataFrame]:
        return [self._merge(p) if p else pl.DataFrame(schema={"key": pl.Int64, "count": pl.Int64}) for p in self.parts]

    @staticmethod
    def subtract(totals: list[pl.DataFrame], others: list[pl.DataFrame]) -> list[pl.DataFrame]:
        """``totals`` minus ``others`` per category (keys left at zero are dropped)."""
        return [
            t.join(o.rename({"count": "minus"}), on="key", how="left")
            .select("key", pl.col("count") - pl.col("minus").fill_null(0))
            .filter(pl.col("count") > 0)
            for t, o in zip(totals, others)
        ]


def _pass1(
    files: Sequence[Path], parser: _Parser, columns: _ColumnFiles, counts: _Counts, progress: tqdm | None
) -> None:
    for path in files:
        for block, first_line, lines in prefetched(read_blocks(path), 2):
            df = parser.parse(block, path, first_line, lines)
            columns.append(df, parser)
            counts.add([df[c] for c in parser.cats])
            if progress is not None:
                progress.update(len(block))


def preprocess_criteo(
    raw_files: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    recipe: CriteoRecipe | None = None,
    test_files: Sequence[str | os.PathLike] | None = None,
    test_fraction: float | None = None,
    bad_rows: str = "error",
    overwrite: bool = False,
    progress: bool = False,
) -> dict:
    """Raw Criteo TSV -> a split-binary dataset with ``train`` and ``test`` mappings, on Polars.

    Args:
        raw_files: training input (plain or gzip), in order.
        out_dir: dataset directory to create; it appears only when complete.
        recipe: the recipe's parameters (frequency threshold, column counts); default CriteoRecipe().
        test_files: files of the test split; if None, the last ``test_fraction`` of the rows of
            ``raw_files`` (in order) is the test split.
        test_fraction: see ``test_files``.
        bad_rows: "error" (default: stop at the first bad row, naming file and line) or "skip"
            (drop, count, and keep the first 20 in ``rejects.jsonl``).
        overwrite: replace an existing dataset directory.
        progress: show a progress bar over the input bytes.

    Returns:
        The summary also written to ``summary.json``: rows per split, bad rows, cardinalities, seconds.
    """
    recipe = recipe or CriteoRecipe()
    check_arguments(recipe, raw_files, test_files, test_fraction, bad_rows)
    start = time.perf_counter()
    train_paths = [Path(p) for p in raw_files]
    test_paths = [Path(p) for p in test_files] if test_files is not None else []
    for path in train_paths + test_paths:
        if not path.exists():
            raise ValueError(f"{path}: input file not found")
    rejects = Rejects(bad_rows)
    parser = _Parser(recipe, rejects)
    with DatasetOutput(out_dir, recipe, overwrite) as out:
        columns = _ColumnFiles(out.scratch, recipe)
        total_bytes = sum(p.stat().st_size for p in train_paths + test_paths)
        bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="preprocess pass 1", disable=not progress)
        with bar:
            counts = _Counts(recipe.num_categorical)
            _pass1(train_paths, parser, columns, counts, bar)
            n_train = columns.rows
            train_counts = counts.totals()
            _pass1(test_paths, parser, columns, counts, bar)
            columns.close()
        if test_files is None:  # the test split is the tail: count it again and take it off
            n_train = columns.rows - int(round(columns.rows * test_fraction))
            tail = _Counts(recipe.num_categorical)
            for lo in range(n_train, columns.rows, PASS2_ROWS):
                tail.add([pl.Series(k) for k in columns.read(lo, min(columns.rows, lo + PASS2_ROWS))[2]])
            train_counts = _Counts.subtract(train_counts, tail.totals())
        out.check_split(n_train, columns.rows - n_train)
        vocabularies = [vocab_mod.vocabulary(c, recipe.frequency_threshold) for c in train_counts]
        out.start(vocabularies)
        for mapping, lo, hi in (("train", 0, n_train), ("test", n_train, columns.rows)):
            for a in tqdm(range(lo, hi, PASS2_ROWS), desc=f"preprocess write {mapping}", disable=not progress):
                labels, numerical, keys = columns.read(a, min(hi, a + PASS2_ROWS))
                out.append(mapping, numerical, vocab_mod.lookup(keys, vocabularies), labels)
        summary = out.finish("polars", n_train, columns.rows - n_train, rejects, time.perf_counter() - start)
    return summary
