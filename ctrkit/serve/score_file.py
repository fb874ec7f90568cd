"""Batch prediction: a CSV or Parquet file of raw rows in, one click probability a row out.

The rows go through the preprocessing the model carries (``preprocess/transform.py``) and the model as the server
runs it (``Predictor``), in blocks, so memory stays bounded whatever the file's size: the input is read as a
stream of blocks, each block scored and appended to the output (CSV), or written as a part that one streaming pass
joins at the end (Parquet). The output appears at its path only when complete.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from ctrkit.data.atomic import atomic_file
from ctrkit.preprocess.transform import RowError, RowTransform
from ctrkit.serve.predictor import Predictor

BLOCK_ROWS = 1 << 16
PROBABILITY_COLUMN = "probability"
PARQUET_SUFFIXES = (".parquet", ".pq")


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() in PARQUET_SUFFIXES


CSV_CHUNK_BYTES = 16 << 20  # a CSV is read this much at a time, cut at a record's end
PARQUET_READ_ROWS = 1 << 18  # a Parquet file is read this many rows at a time (Polars' row group size)


def _blocks(
    path: Path, columns: Sequence[str], separator: str, null_values: Sequence[str], rows: int
) -> Iterator[pl.DataFrame]:
    """The input's ``columns`` in blocks of at most ``rows`` rows, in file order (CSV values as text). The file is
    read a piece at a time, never ahead of the blocks asked for, so memory does not grow with the file (Polars'
    streaming batches buffer ahead of a slow consumer)."""
    if is_parquet(path):
        frame = pl.scan_parquet(path)
    else:
        frame = pl.scan_csv(path, infer_schema=False, separator=separator, null_values=list(null_values) or None)
    try:
        header = frame.collect_schema().names()
    except (OSError, pl.exceptions.PolarsError) as e:
        raise ValueError(f"{path}: not a readable {'Parquet' if is_parquet(path) else 'CSV'} file: "
                         f"{str(e).splitlines()[0]}") from None  # fmt: skip
    missing = [c for c in columns if c not in header]
    if missing:
        raise ValueError(f"{path}: has no column {', '.join(repr(c) for c in missing)} (columns: {', '.join(header)}); "
                         "the model reads every column it was trained on (the label is not needed)")  # fmt: skip
    pieces = _parquet_pieces(frame, columns) if is_parquet(path) else _csv_pieces(path, columns, separator, null_values)
    try:
        for piece in pieces:
            for start in range(0, len(piece), rows):
                yield piece.slice(start, rows)
    except pl.exceptions.PolarsError as e:
        raise ValueError(f"{path}: {str(e).splitlines()[0]}") from None


def _parquet_pieces(frame: pl.LazyFrame, columns: Sequence[str]) -> Iterator[pl.DataFrame]:
    start = 0
    while True:
        piece = frame.select(columns).slice(start, PARQUET_READ_ROWS).collect()
        if not len(piece):
            return
        yield piece
        start += len(piece)


def _csv_pieces(
    path: Path, columns: Sequence[str], separator: str, null_values: Sequence[str]
) -> Iterator[pl.DataFrame]:
    """The CSV's rows in pieces of about ``CSV_CHUNK_BYTES``, each cut after a record's end (a newline outside
    quotes: quoted fields may hold newlines) and parsed with the header."""
    with open(path, "rb") as f:
        header = _record(f)
        carry = b""
        while True:
            chunk = f.read(CSV_CHUNK_BYTES)
            data = carry + chunk
            cut = len(data) if not chunk else _last_record_end(data)
            if cut:
                yield pl.read_csv(io.BytesIO(header + data[:cut]), infer_schema=False, separator=separator,
                                  null_values=list(null_values) or None, columns=list(columns))  # fmt: skip
            carry = data[cut:]
            if not chunk:
                return


def _record(f) -> bytes:
    """The next record of a binary file, its newline included (lines joined while a quote is open)."""
    line = f.readline()
    while line.count(b'"') % 2 and (more := f.readline()):
        line += more
    return line if line.endswith(b"\n") else line + b"\n"


def _last_record_end(data: bytes) -> int:
    """The end (after its newline) of the last whole record in ``data`` (0: none): the last newline with an even
    number of quote characters before it."""
    quotes = data.count(b'"')
    end = len(data)
    while (newline := data.rfind(b"\n", 0, end)) >= 0:
        quotes -= data.count(b'"', newline, end)
        if quotes % 2 == 0:
            return newline + 1
        end = newline
    return 0


def score_file(
    predictor: Predictor,
    transform: RowTransform,
    source: str | os.PathLike,
    out: str | os.PathLike,
    keep: Sequence[str] = (),
    separator: str = ",",
    block_rows: int = BLOCK_ROWS,
    progress: bool = False,
) -> dict:
    """Scores every row of ``source`` (CSV with a header, or Parquet) into ``out`` (CSV, or Parquet by its
    suffix): the ``keep`` columns as they were read, then ``probability``.

    Returns:
        rows scored, mean probability, seconds.
    """
    source, out = Path(source), Path(out)
    if not source.is_file():
        raise ValueError(f"{source}: input file not found")
    if PROBABILITY_COLUMN in keep:
        raise ValueError(f"`keep`: '{PROBABILITY_COLUMN}' is the output's own column")
    needed = transform.column_names
    columns = list(dict.fromkeys([*needed, *keep]))
    start = time.perf_counter()
    rows, total = 0, 0.0
    parquet = is_parquet(out)
    bar = tqdm(unit="row", desc="predict", disable=not progress)
    with atomic_file(out) as tmp, bar:
        parts = Path(tempfile.mkdtemp(dir=tmp.parent, prefix=f".{out.name}.parts-")) if parquet else None
        try:
            with open(tmp, "wb") as sink:
                for block in _blocks(source, columns, separator, transform.null_values, block_rows):
                    try:
                        inputs = transform.raw_rows(block, first_row=rows)
                    except RowError as e:
                        raise RowError(f"{source}: {e}") from None
                    probability = predictor(*inputs).reshape(-1)
                    scored = pl.DataFrame([*(block[c] for c in keep), pl.Series(PROBABILITY_COLUMN, probability)])
                    if parquet:
                        scored.write_parquet(parts / f"{rows:015d}.parquet")
                    else:
                        scored.write_csv(sink, include_header=rows == 0)
                    rows += len(block)
                    total += float(probability.astype(np.float64).sum())
                    bar.update(len(block))
            if not parquet and rows == 0:  # an input without rows: the header alone
                pl.DataFrame(schema={**{c: pl.String for c in keep}, PROBABILITY_COLUMN: pl.Float32}).write_csv(tmp)
            if parquet:
                files = sorted(parts.glob("*.parquet"))
                if files:
                    pl.scan_parquet(files).sink_parquet(tmp)
                else:  # an input without rows: an empty table of the output's columns
                    pl.DataFrame(schema={**{c: pl.String for c in keep}, PROBABILITY_COLUMN: pl.Float32}).write_parquet(
                        tmp
                    )
        finally:
            if parts is not None:
                shutil.rmtree(parts, ignore_errors=True)
    seconds = time.perf_counter() - start
    return {"rows": rows, "mean": total / rows if rows else float("nan"), "seconds": seconds}
