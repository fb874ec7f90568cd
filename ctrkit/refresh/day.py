"""A day of a click log as ``refresh`` reads it: every file read by ``table_reader``'s rules (the one reader of a
user's file), the rows ordered by the table's rule (``table_rows.ordered``), their labels by the recipe's rule
(``table_recipe.label_values``), split into the rows trained on today and the held-out tail, and scored by a model
from their raw values as ``predict --input`` and the server score them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.preprocess.output import Rejects
from ctrkit.preprocess.table_recipe import FILE_COL, LINE_COL, TableRecipe, label_values
from ctrkit.preprocess.table_rows import LABEL, Steps, add_rejects, clean_frame, merged_schema, order_rows, read_file
from ctrkit.preprocess.transform import RowError, RowTransform

SCORE_ROWS = 1 << 16  # raw rows scored at a time


@dataclass(frozen=True)
class Day:
    """A day's rows in time order with where each came from (``FILE_COL``, ``LINE_COL``) and its 0/1 ``labels``
    (int8), and the files they were read from."""

    rows: pl.DataFrame
    labels: np.ndarray
    files: tuple[Path, ...]

    def __len__(self) -> int:
        return self.rows.height

    @property
    def columns(self) -> list[str]:
        """The log's own columns (where each row came from left out)."""
        return [c for c in self.rows.columns if c not in (FILE_COL, LINE_COL)]

    def where(self, row: int) -> str:
        """``file:line`` of row ``row``."""
        return f"{self.files[self.rows[FILE_COL][row]]}:{self.rows[LINE_COL][row]}"

    def split(self, fraction: float) -> tuple[Day, Day]:
        """(the rows before the held-out tail, the tail): the last ``fraction`` of the rows, at least one row of
        each where the day has two."""
        n = len(self)
        tail = min(n - 1, max(1, int(round(n * fraction)))) if n >= 2 else 0
        cut = n - tail
        return (Day(self.rows[:cut], self.labels[:cut], self.files),
                Day(self.rows[cut:], self.labels[cut:], self.files))  # fmt: skip

    def raw(self) -> pl.DataFrame:
        """The rows as the log holds them (no bookkeeping columns), for a file the preprocessing reads."""
        return self.rows.select(self.columns)


def read_day(files: Sequence[str | Path], recipe: TableRecipe) -> Day:
    """The day of ``files`` (CSV or Parquet, in order), each read as ``preprocess table`` reads a file
    (``table_rows.read_file``), ordered by ``recipe``'s rule, each row's label by its label rule; a row whose label
    is not one is refused naming its file and line, or dropped with ``bad_rows`` skip (``clean_frame``, as
    ``preprocess table`` does)."""
    paths = [Path(p) for p in files]
    if not paths:
        raise ValueError("no day files given")
    frames = [read_file(path, recipe, i) for i, path in enumerate(paths)]
    schema = merged_schema([f.schema for f in frames], paths, len(paths))
    rows = pl.concat([f.select(list(schema)) for f in frames], how="vertical_relaxed")
    if recipe.label not in rows.columns:
        raise ValueError(f"{paths[0]}: has no label column '{recipe.label}' (columns: "
                         f"{', '.join(c for c in rows.columns if c not in (FILE_COL, LINE_COL))})")  # fmt: skip
    label, problem = label_values(recipe)
    steps = Steps(problem, label, (), recipe.order_by, recipe.shuffle_seed)
    good, bad = clean_frame(rows, steps)
    add_rejects(Rejects(recipe.bad_rows), bad, paths)  # (the first bad row raises, unless skipped)
    good = order_rows(good, steps)
    return Day(good.drop(LABEL), good[LABEL].to_numpy().astype(np.int8), tuple(paths))


def score_day(predictor, transform: RowTransform, day: Day, block_rows: int = SCORE_ROWS,
              each: Callable[[int, tuple], None] | None = None) -> np.ndarray:  # fmt: skip
    """(N,) float64 click probabilities of ``day``'s rows from their raw values, as the server scores them (the
    model's carried preprocessing, then the model); a value the model cannot read is a ValueError naming its file
    and line. ``each(first_row, inputs)`` sees every block's inputs (the day's profile counts its unseen values from
    them: one pass of the preprocessing)."""
    out = np.empty(len(day), np.float64)
    columns = [c for c in transform.column_names if c in day.rows.columns]
    for lo in range(0, len(day), block_rows):
        block = day.rows[lo : lo + block_rows]
        try:
            inputs = transform.raw_rows(block.select(columns))
        except RowError as e:
            where = day.where(lo + e.row) if e.row is not None else str(day.files[0])
            raise ValueError(f"{where}: {e.what if e.row is not None else e}") from None
        if each is not None:
            each(lo, inputs)
        out[lo : lo + len(block)] = np.asarray(predictor(*inputs), np.float64).reshape(-1)
    return out
