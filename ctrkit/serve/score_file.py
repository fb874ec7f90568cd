"""Batch prediction: a CSV or Parquet file of raw rows in, one click probability a row out.

The rows go through the preprocessing the model carries (``preprocess/transform.py``) and the model as the server
runs it (``Predictor``), in blocks, so memory stays bounded whatever the file's size: the input is read as a
stream of blocks, each block scored and appended to the output (CSV), or written as a part that one streaming pass
joins at the end (Parquet). The output appears at its path only when complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.columns import Role
from ctrkit.data.atomic import atomic_file, check_output, temporary_prefix
from ctrkit.preprocess.table_reader import is_parquet, separator_char, table_blocks, table_columns
from ctrkit.preprocess.transform import RowError, RowTransform
from ctrkit.preprocess.values import BadValues
from ctrkit.progress import tqdm
from ctrkit.serve.predictor import Predictor

BLOCK_ROWS = 1 << 16
PROBABILITY_COLUMN = "probability"


def _no_rows(keep: Sequence[str]) -> pl.DataFrame:
    """The output of an input without rows: its columns (``keep``, then ``probability``), no row."""
    return pl.DataFrame(schema={**{c: pl.String for c in keep}, PROBABILITY_COLUMN: pl.Float32})


def score_file(
    predictor: Predictor,
    transform: RowTransform,
    source: str | os.PathLike,
    out: str | os.PathLike,
    keep: Sequence[str] = (),
    separator: str = ",",
    block_rows: int = BLOCK_ROWS,
    progress: bool = False,
    missing_columns: str = "error",
    bad: BadValues | None = None,
) -> dict:
    """Scores every row of ``source`` (CSV with a header, or Parquet) into ``out`` (CSV, or Parquet by its
    suffix): the ``keep`` columns as they were read, then ``probability``, one row per record. The file is read by
    ``table_reader``'s rules (a source's files without a header, Criteo's days, in the transform's
    ``file_columns`` and ``file_separator``); its columns follow ``RowTransform.check_columns`` with
    ``missing_columns``; a bad value (``values``) is refused, naming its line and column, or under ``bad``'s rule
    "missing" scored as missing and counted there (the first named by its line).

    Returns:
        rows scored, mean probability, seconds.
    """
    source, out = Path(source), Path(out)
    if not source.is_file():
        raise ValueError(f"{source}: input file not found")
    check_output(out, [source])
    names = transform.file_columns or None  # a source whose files have no header (Criteo's days): its layout
    separator = transform.file_separator if names and not is_parquet(source) else separator_char(separator)
    if PROBABILITY_COLUMN in keep:
        raise ValueError(f"`keep`: '{PROBABILITY_COLUMN}' is the output's own column")
    header = table_columns(source, separator, names)
    try:
        transform.check_columns(header, missing_columns)
    except RowError as e:
        raise RowError(f"{source}: {e.what}", setting=e.setting) from None
    columns = list(dict.fromkeys([*(c for c in transform.column_names if c in header), *keep]))
    start = time.perf_counter()
    rows, total = 0, 0.0
    parquet = is_parquet(out)
    bar = tqdm(unit="row", desc="predict", disable=not progress)
    with atomic_file(out) as tmp, bar:
        # named as the output's temporaries, so that a later run removes it should this process be killed
        parts = Path(tempfile.mkdtemp(dir=tmp.parent, prefix=temporary_prefix(out) + "parts-")) if parquet else None
        try:
            with open(tmp, "wb") as sink:
                lists = [c.name for c in transform.columns if c.role == Role.MULTI_HOT]
                blocks = table_blocks(source, columns, separator, transform.null_values, block_rows, lists, names)
                for block, lines in blocks:
                    found = BadValues(bad.rule) if bad is not None else None
                    try:
                        inputs = transform.raw_rows(block, found)
                    except RowError as e:
                        where = source if e.row is None else f"{source}:{int(lines[e.row])}"
                        raise RowError(f"{where}: {e.what}", setting=e.setting) from None
                    if bad is not None and found is not None and found.count and found.row is not None:
                        # the first named by its line
                        bad.add(found.count, found.text or "", where=f"{source}:{int(lines[found.row])}")
                    probability = predictor(*inputs).reshape(-1)
                    scored = pl.DataFrame([*(block[c] for c in keep), pl.Series(PROBABILITY_COLUMN, probability)])
                    if parts is not None:
                        scored.write_parquet(parts / f"{rows:015d}.parquet")
                    else:
                        scored.write_csv(sink, include_header=rows == 0)
                    rows += len(block)
                    total += float(probability.astype(np.float64).sum())
                    bar.update(len(block))
            if not parquet and rows == 0:  # an input without rows: the header alone
                _no_rows(keep).write_csv(tmp)
            if parts is not None:
                files = sorted(parts.glob("*.parquet"))
                if files:
                    pl.scan_parquet(files).sink_parquet(tmp)
                else:  # an input without rows: an empty table of the output's columns
                    _no_rows(keep).write_parquet(tmp)
        finally:
            if parts is not None:
                shutil.rmtree(parts, ignore_errors=True)
    seconds = time.perf_counter() - start
    return {"rows": rows, "mean": total / rows if rows else float("nan"), "seconds": seconds}
