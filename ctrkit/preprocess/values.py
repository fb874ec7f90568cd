"""What a raw value is: the one reading of a number and of a timestamp, for fitting (``preprocess table``, whose bad
rows these problems make) and for scoring (the fitted ``RowTransform`` that ``predict --input``, ``ctrkit serve`` and
the Triton Python-backend model apply), so that a value refused when the table was fitted is never scored silently.

A number is a finite number whose magnitude float32 (the dataset's type) holds; NaN is a missing value (Parquet
writers and pandas write it for one), as the empty text and the null texts are; an integer column's (Criteo's
I1..I13) number has no fraction. A timestamp is a value of its column's format (``time_parts.parse``). A
hexadecimal category (Criteo's C1..C26) is 1 to 15 hexadecimal digits. Anything else in a numerical, timestamp or
hexadecimal column is a bad value: a bad row when fitting, and when scoring refused, naming the row and column,
unless the scorer is told ``--bad-values missing`` (then it is scored as missing and counted: ``BadValues``).
Criteo's engines check its integers and categories by their own rules (Spark's in Spark SQL); these are the same
verdicts, for the scorers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ctrkit.config import BAD_VALUES
from ctrkit.preprocess.time_parts import parse

FLOAT32_MAX = 3.4028234663852886e38


def _number_conditions(values: pl.Expr) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """Text that is no number, an infinity, a magnitude float32 cannot hold (it would become infinite)."""
    as_float = values.cast(pl.Float64, strict=False)
    return (values.is_not_null() & as_float.is_null(), as_float.is_infinite(),
            as_float.fill_nan(None).abs() > FLOAT32_MAX)  # fmt: skip


def bad_numbers(as_float: np.ndarray, unreadable: np.ndarray, integer: np.ndarray) -> np.ndarray:
    """Which values ``number_problem`` (and, for the columns where ``integer`` is true, ``integer_problem``) finds
    bad, of values already cast:
    ``as_float`` (n, k) float64 (NaN where missing, NaN or unreadable), ``unreadable`` (n, k) true where a value
    given was no number; what a scorer checks with one cast a column."""
    with np.errstate(invalid="ignore"):
        bad = unreadable | (np.abs(as_float) > FLOAT32_MAX)
        if integer.any():
            bad |= integer & np.isfinite(as_float) & (np.round(as_float) != as_float)
    return bad


def number_problem(values: pl.Expr, column: str) -> pl.Expr:
    """The problem of a value of the numerical ``column`` (null where it is a number or missing, NaN included)."""
    text, infinite, beyond = _number_conditions(values)
    shown = values.cast(pl.String)
    return (
        pl.when(text)
        .then(pl.format(f"column '{column}' holds '{{}}'; expected a number (or nothing, for a missing value)", shown))
        .when(infinite)
        .then(pl.format(f"column '{column}' holds '{{}}'; expected a finite number", shown))
        .when(beyond)
        .then(pl.format(f"column '{column}' holds '{{}}', beyond float32's range (magnitude at most 3.4e38)", shown))
    )


def integer_bad(values: pl.Expr) -> pl.Expr:
    """Whether a value of an integer column (Criteo's I1..I13) is bad: its text no integer of at most 18 digits
    (Criteo's recipe refuses such a row when fitting); false where missing."""
    return (values.is_not_null() & ~values.cast(pl.String).str.contains(r"^[+-]?[0-9]{1,18}$")).fill_null(False)


def integer_problem(values: pl.Expr, column: str) -> pl.Expr:
    """The problem of a value of the integer ``column`` (null where fine, or missing)."""
    return pl.when(integer_bad(values)).then(
        pl.format(f"column '{column}' holds '{{}}'; expected an integer", values.cast(pl.String))
    )


def hex_bad(values: pl.Expr) -> pl.Expr:
    """Whether a value of a hexadecimal category (Criteo's C1..C26: 1 to 15 hexadecimal digits, no sign) is bad;
    false where missing or empty (``vocabulary.key_of``'s rule)."""
    return (values.is_not_null() & ~values.cast(pl.String).str.contains(r"^[0-9a-fA-F]{0,15}$")).fill_null(False)


def hex_problem(values: pl.Expr, column: str) -> pl.Expr:
    """The problem of a value of the hexadecimal category ``column`` (null where fine, or missing)."""
    return pl.when(hex_bad(values)).then(
        pl.format(f"column '{column}' holds '{{}}'; expected a hexadecimal category (1 to 15 digits)",
                  values.cast(pl.String)))  # fmt: skip


def timestamp_bad(values: pl.Expr, time_format: str) -> pl.Expr:
    """Whether a value of a timestamp column of ``time_format`` is bad: false where it is one, or missing."""
    return (values.is_not_null() & parse(values, time_format).is_null()).fill_null(False)


def timestamp_problem(values: pl.Expr, column: str, time_format: str) -> pl.Expr:
    """The problem of a value of the timestamp ``column`` of ``time_format`` (null where it is one, or missing)."""
    hint = "a value of another format is refused: --time-format names the format"
    if time_format == "unix":
        hint = "seconds since 1970; a count of milliseconds is --time-format unix_ms"
    elif time_format == "unix_ms":
        hint = "milliseconds since 1970"
    return pl.when(timestamp_bad(values, time_format)).then(
        pl.format(
            f"column '{column}' holds '{{}}'; expected a timestamp of the column's format {time_format!r} ({hint})",
            values.cast(pl.String),
        )  # fmt: skip
    )


@dataclass
class BadValues:
    """What a scorer does with bad values (``rule``, one of ``BAD_VALUES``) and, under "missing", how many it scored
    as missing (``count``) and the first: its problem (``text``), its row among the rows given (``row``, from 0) or
    its place as the scorer names it (``where``: a file's line)."""

    rule: str = "error"
    count: int = 0
    text: str | None = None
    row: int | None = None
    where: str | None = None

    def __post_init__(self):
        if self.rule not in BAD_VALUES:
            raise ValueError(f"`bad_values` must be one of {', '.join(BAD_VALUES)}, got {self.rule!r}")

    def add(self, count: int, text: str, row: int | None = None, where: str | None = None) -> None:
        """``count`` more bad values scored as missing, the first of them ``text`` (at ``row`` or ``where``)."""
        self.count += count
        if self.text is None:
            self.text, self.row, self.where = text, row, where

    def summary(self) -> str:
        """One line for a scorer's summary: how many values were scored as missing, and the first ("" for none)."""
        if not self.count:
            return ""
        place = self.where or (f"row {self.row + 1}" if self.row is not None else "")
        return f"{self.count:,} bad values scored as missing (--bad-values missing); the first, {place}: {self.text}"
