"""The Criteo recipe on Polars, the embedded default engine: streaming, memory bounded.

Pass 1 reads the input in blocks of whole lines (~24 MB) on one thread, parses and validates them on
a second (Polars' typed CSV reader; hex categories become int64 keys), and on the main thread gives
every key a dense per-column code (``KeyIndex``) and appends labels, transformed numerical values and
codes to temporary column files. Then the train split's codes are counted, the vocabularies built,
and pass 2 maps codes to ids with one gather per column into the split-binary dataset. Peak memory is
a few blocks plus the key indexes, whatever the number of rows.
"""

from __future__ import annotations

import ctypes
import gzip
import os
import time
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from ctrkit.columns import label_of
from ctrkit.data.prefetch import prefetched
from ctrkit.preprocess import vocabulary as vocab_mod
from ctrkit.preprocess.criteo import CriteoRecipe, check_arguments, numerical_transform
from ctrkit.preprocess.key_index import KeyIndex
from ctrkit.preprocess.output import DatasetOutput, Rejects
from ctrkit.preprocess.table_reader import check_text, open_bytes
from ctrkit.progress import tqdm

if TYPE_CHECKING:
    from ctrkit.preprocess.like import Like

BLOCK_BYTES = 24 << 20  # under glibc's mmap threshold, so block buffers are reused, not page-faulted anew
PASS2_ROWS = 1 << 18  # rows per pass-2 block
COUNT_ROWS = 1 << 22  # codes per bincount when counting the train split
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def _open(path: Path):
    if not path.exists():
        raise ValueError(f"{path}: input file not found")
    if path.is_dir():
        raise ValueError(f"{path}: is a directory; expected a Criteo TSV file (plain or .gz)")
    return open_bytes(path)


def read_blocks(path: Path, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[bytes, int, int]]:
    """Blocks of whole lines of ``path`` (plain or gzip), each with the 1-based number of its first line
    and its number of lines (counted once, here, on the reading thread).

    Every block ends with a newline (one is added after a last line that lacks it).
    """
    line, rest, empty = 1, b"", True
    with _open(path) as f:
        while data := _read(f, path, line, block_bytes):
            if empty:  # the first record read by the table reader's rules: UTF-16 or lone-CR line ends refused
                check_text(path, data[: data.find(b"\n") + 1] if b"\n" in data else data)
            empty = False
            data = rest + data if rest else data
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            block, rest = (data, b"") if cut == len(data) else (data[:cut], data[cut:])
            lines = _count(block, b"\n")
            yield block, line, lines
            line += lines
    if empty:
        raise ValueError(f"{path}: input file is empty")
    if rest:
        yield rest + b"\n", line, 1  # a last line without its newline


def _read(f, path: Path, line: int, size: int) -> bytes:
    """The next ``size`` bytes; a truncated or corrupt gzip stream is a one-line ValueError."""
    try:
        return f.read(size)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ValueError(f"{path}: the gzip stream is truncated or corrupt after line {line - 1}: {e}") from None


def _count(data: bytes, byte: bytes) -> int:
    """How often ``byte`` occurs in ``data``: numpy counts 4x faster than ``bytes.count``."""
    return int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) == ord(byte)))


@dataclass
class _Rows:
    """The good rows of one block: labels (n,) uint8, numerical (n, n_num) float16, keys per category (n,)."""

    labels: np.ndarray
    numerical: np.ndarray
    keys: list[np.ndarray]


class _Parser:
    """Parses blocks into the good rows' values; bad rows are raised or handed to ``rejects``."""

    def __init__(self, recipe: CriteoRecipe, rejects: Rejects):
        self.recipe = recipe
        self.rejects = rejects
        self.names = [recipe.field_name(i) for i in range(recipe.num_fields)]
        self.nums = self.names[1 : 1 + recipe.num_numerical]
        self.cats = self.names[1 + recipe.num_numerical :]
        self.typed = {"label": pl.UInt8, **dict.fromkeys(self.nums, pl.Int64), **dict.fromkeys(self.cats, pl.String)}

    def parse(self, block: bytes, path: Path, first_line: int, lines: int) -> _Rows:
        """Good rows of ``block`` (``lines`` lines, the first numbered ``first_line``)."""
        if b"+" not in block:  # hex parsing would accept a sign: such rare blocks take the checking path
            df = self._fast(block, lines)
            keys = None if df is None else self._keys(df)
            if keys is not None:
                return self._rows(df, keys)
        df = self._slow(block, path, first_line)
        return self._rows(df, [df[c].to_numpy() for c in self.cats])

    def _rows(self, df: pl.DataFrame, keys: list[np.ndarray]) -> _Rows:
        if self.nums:
            numerical = numerical_transform(df.select([pl.col(n).fill_null(-2) for n in self.nums]).to_numpy())
        else:
            numerical = np.zeros((len(df), 0), dtype=np.float16)
        return _Rows(df["label"].to_numpy(), numerical, keys)

    def _fast(self, block: bytes, lines: int) -> pl.DataFrame | None:
        """Polars' own typed tab parser, when the block's tab count vouches for every line; else None.

        The native reader is several times faster than splitting lines, but it reads a missing trailing
        field as an empty one. It refuses a line with too many fields, so a total of exactly
        ``fields - 1`` tabs per line means every line has them all.
        """
        if _count(block, b"\t") != lines * (self.recipe.num_fields - 1):
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

    def _keys(self, df: pl.DataFrame) -> list[np.ndarray] | None:
        """The categorical columns' keys (as ``vocabulary.key_expr`` makes them), or None if any value is
        not a category. The block holds no sign, so an unsigned hex parse plus the length is the key."""
        parsed = df.select(
            *[pl.col(c).str.to_integer(base=16, dtype=pl.UInt64, strict=False).alias(c) for c in self.cats],
            *[pl.col(c).str.len_bytes().cast(pl.UInt64).alias(f"_len_{c}") for c in self.cats],
        )
        # to_integer gives null for the empty value (missing, key 0) and for non-hex values (bad)
        longest, bad = parsed.select(
            pl.max_horizontal(pl.col(f"_len_{c}").max() for c in self.cats),
            pl.sum_horizontal(pl.col(c).null_count() - (pl.col(f"_len_{c}") == 0).sum() for c in self.cats),
        ).row(0)
        if bad or longest > vocab_mod.MAX_DIGITS:
            return None
        shift = pl.lit(1 << vocab_mod.LENGTH_SHIFT, dtype=pl.UInt64)
        keys = parsed.select((pl.col(c).fill_null(0) + pl.col(f"_len_{c}") * shift).alias(c) for c in self.cats)
        return [keys[c].to_numpy().view(np.int64) for c in self.cats]

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
            label_of(pl.col("label"), "label")[1],
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
            label_of(pl.col("label"), "label")[0].alias("label"),
            *[pl.col(n).cast(pl.Int64, strict=False) for n in self.nums],
            *[pl.col(f"_key_{c}").alias(c) for c in self.cats],
        )


class _ColumnFiles:
    """Temporary per-column files of pass 1: labels, numerical block, one code file per category.

    Every category's keys are coded by a ``KeyIndex`` as they arrive (the columns on parallel threads).
    """

    def __init__(self, directory: Path, recipe: CriteoRecipe, pool: ThreadPoolExecutor):
        directory.mkdir()
        self.recipe = recipe
        self.pool = pool
        self.indexes = [KeyIndex() for _ in range(recipe.num_categorical)]
        self.label = directory / "label.u8"
        self.numerical = directory / "numerical.f16"
        self.codes = [directory / f"codes_{j}.u32" for j in range(recipe.num_categorical)]
        self._files = [open(p, "wb") for p in (self.label, self.numerical, *self.codes)]
        self.rows = 0

    def append(self, rows: _Rows) -> None:
        label_f, num_f, *code_f = self._files
        label_f.write(rows.labels)  # arrays write without a bytes copy
        num_f.write(np.ascontiguousarray(rows.numerical))  # Polars hands columns over in Fortran order

        def code(j: int) -> None:
            code_f[j].write(self.indexes[j].codes(rows.keys[j]))

        list(self.pool.map(code, range(len(code_f))))
        self.rows += len(rows.labels)

    def close(self) -> None:
        for f in self._files:
            f.close()

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Rows [lo, hi): labels (n,), numerical (n, n_num) float16, codes per category (n,) uint32."""
        n, width = hi - lo, self.recipe.num_numerical
        labels = np.fromfile(self.label, np.uint8, n, offset=lo)
        numerical = np.fromfile(self.numerical, np.float16, n * width, offset=lo * width * 2).reshape(n, width)
        codes = [np.fromfile(p, np.uint32, n, offset=lo * 4) for p in self.codes]
        return labels, numerical, codes

    def counts(self, lo: int, hi: int) -> list[np.ndarray]:
        """How often each code of each category occurs in rows [lo, hi), (codes,) int64 per category."""

        def count(j: int) -> np.ndarray:
            total = np.zeros(len(self.indexes[j]), dtype=np.int64)
            for a in range(lo, hi, COUNT_ROWS):
                n = min(hi, a + COUNT_ROWS) - a
                total += np.bincount(np.fromfile(self.codes[j], np.uint32, n, offset=a * 4), minlength=len(total))
            return total

        return list(self.pool.map(count, range(len(self.codes))))


def _pass1(files: Sequence[Path], parser: _Parser, columns: _ColumnFiles, progress: tqdm | None) -> None:
    """Three stages on three threads, one block apart: read, parse, code and write (this thread)."""
    for path in files:
        blocks = prefetched(read_blocks(path), 1)
        parsed = ((parser.parse(b, path, first, lines), len(b)) for b, first, lines in blocks)
        for rows, size in prefetched(parsed, 1):
            columns.append(rows)
            if progress is not None:
                progress.update(size)


def _vocabulary(index: KeyIndex, counts: np.ndarray, frequency_threshold: int) -> tuple[pl.DataFrame, np.ndarray]:
    """One column's vocabulary from its codes' train counts, and the id of each code."""
    seen = counts > 0
    vocab = vocab_mod.vocabulary(pl.DataFrame({"key": index.keys[seen], "count": counts[seen]}), frequency_threshold)
    return vocab, vocab_mod.ids_of_keys(index.keys, vocab)


def _extended(old: pl.DataFrame | None, fresh: pl.DataFrame, index: KeyIndex, frequency_threshold: int
              ) -> tuple[pl.DataFrame, np.ndarray] | None:  # fmt: skip
    """A model's vocabulary ``old`` (None for a raw-id column: nothing to extend) extended by the day's ``fresh``
    counts (``vocabulary.extend_keyed``), and the id of each code."""
    if old is None:
        return None
    grown = vocab_mod.extend_keyed(old, fresh, frequency_threshold)
    return grown, vocab_mod.ids_of_keys(index.keys, grown)


def preprocess_criteo(
    raw_files: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    recipe: CriteoRecipe | None = None,
    test_files: Sequence[str | os.PathLike] | None = None,
    test_fraction: float | None = None,
    validation_fraction: float | None = None,
    bad_rows: str = "error",
    overwrite: bool = False,
    progress: bool = False,
    like: Like | None = None,
) -> dict:
    """Raw Criteo TSV -> a split-binary dataset with ``train`` and ``test`` mappings, on Polars.

    Args:
        raw_files: training input (plain or gzip), in order.
        out_dir: dataset directory to create; it appears only when complete.
        recipe: the recipe's parameters (frequency threshold, column counts); default CriteoRecipe().
        test_files: files of the test split; if None, the last ``test_fraction`` of the rows of
            ``raw_files`` (in order) is the test split.
        test_fraction: see ``test_files``.
        validation_fraction: the last fraction of the train rows becomes a ``validation`` mapping (not
            counted into the vocabularies), as NVIDIA holds out part of its last days; None: none.
        bad_rows: "error" (default: stop at the first bad row, naming file and line) or "skip"
            (drop, count, and keep the first 20 in ``rejects.jsonl``).
        overwrite: replace an existing dataset directory.
        progress: show a progress bar over the input bytes.
        like: a model's carried preprocessing (``preprocess.like.Like``) to write a later day with: its
            vocabularies extended by the day's values (``vocabulary.extend``), its raw-id columns and their tables.

    Returns:
        The summary also written to ``summary.json``: rows per split, bad rows, cardinalities, seconds.
    """
    # one job: the two passes over the day files (the keys counted and coded, the vocabularies fitted on the train
    # mapping's rows, then each mapping's rows written by their ids), which share the column files, the thread pool
    # and the bounds
    recipe = recipe or CriteoRecipe()
    if like is not None:
        recipe = like.criteo_recipe(recipe)
    check_arguments(recipe, raw_files, test_files, test_fraction, bad_rows, validation_fraction)
    start = time.perf_counter()
    train_paths = [Path(p) for p in raw_files]
    test_paths = [Path(p) for p in test_files] if test_files is not None else []
    for path in train_paths + test_paths:
        if not path.exists():
            raise ValueError(f"{path}: input file not found")
    rejects = Rejects(bad_rows)
    parser = _Parser(recipe, rejects)
    _keep_freed_memory()
    with (
        DatasetOutput(out_dir, recipe, overwrite, like) as out,
        ThreadPoolExecutor(os.cpu_count() or 1) as pool,
    ):
        columns = _ColumnFiles(out.scratch, recipe, pool)
        total_bytes = sum(p.stat().st_size for p in train_paths + test_paths)
        bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="preprocess pass 1", disable=not progress)
        with bar:
            _pass1(train_paths, parser, columns, bar)
            n_train = columns.rows
            _pass1(test_paths, parser, columns, bar)
            columns.close()
        if test_files is None:  # the test split is the tail of the rows
            n_train = columns.rows - int(round(columns.rows * test_fraction))
        bounds = out.split(columns.rows, n_train, validation_fraction)
        built = pool.map(
            lambda index, counts: _vocabulary(index, counts, recipe.frequency_threshold),
            columns.indexes,
            columns.counts(0, bounds[0][2]),  # the train mapping's rows
        )
        vocabularies, id_of_code = zip(*built)
        if like is not None:  # the model's vocabularies, extended by the values it has not seen
            grown = [_extended(like.transform.vocabularies.get(f"cat_{i}.bin"), v, index, recipe.frequency_threshold)
                     for i, (v, index) in enumerate(zip(vocabularies, columns.indexes))]  # fmt: skip
            vocabularies = [v if g is None else g[0] for v, g in zip(vocabularies, grown)]
            id_of_code = [ids if g is None else g[1] for ids, g in zip(id_of_code, grown)]
        raw = set(recipe.raw_ids)  # raw-id columns: a code's id is its value's key
        id_of_code = [index.keys if c in raw else ids for c, index, ids in zip(out.cats, columns.indexes, id_of_code)]
        out.start(vocabularies)
        id_of_code = [ids.astype(dtype) for ids, dtype in zip(id_of_code, out.cat_dtypes)]  # as the files store them
        for mapping, lo, hi in bounds:
            chunks = (columns.read(a, min(hi, a + PASS2_ROWS)) for a in range(lo, hi, PASS2_ROWS))
            steps = tqdm(total=hi - lo, unit="row", desc=f"preprocess write {mapping}", disable=not progress)
            with steps:
                for labels, numerical, codes in prefetched(chunks, 1):
                    out.append(mapping, numerical, list(pool.map(np.take, id_of_code, codes)), labels)
                    steps.update(len(labels))
        summary = out.finish("polars", rejects, time.perf_counter() - start)
    return summary


def _keep_freed_memory() -> None:
    """Asks glibc to keep freed memory for reuse instead of handing it back to the kernel at once.

    Pass 1 allocates and frees arrays of a few MB per column per block; by default glibc returns them
    to the kernel and page-faults them in again, which made the run far slower
    (``KeyIndex`` lookups most of all). Peak memory is unchanged: the same arrays are reused.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    libc.mallopt(_M_TRIM_THRESHOLD, 256 << 20)
    libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
