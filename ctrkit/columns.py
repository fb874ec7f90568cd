"""What a column of a click log is: its role among the model's inputs (``Role``) and the one label rule.

The label rule, for every reader of labels (``preprocess table``, ``preprocess criteo`` on both engines,
``preprocess outbrain``, ``transcode``): a click is ``1``, ``1.0`` or ``true``, a non-click ``0``, ``0.0`` or
``false`` (text in any case, or the number or boolean those spell); anything else, and a missing label, is a bad
row. ``preprocess table``'s ``--positive`` and ``--label-threshold`` turn other values into clicks first.
"""

from __future__ import annotations

from enum import StrEnum

import polars as pl

CLICKS = ("1", "1.0", "true")  # a click's label, as lowercase text
NON_CLICKS = ("0", "0.0", "false")
LABEL_PROBLEM = "{name}: expected a label of 0 or 1 (or 1.0/0.0, true/false), got '{value}'"  # a bad label, in words


class Role(StrEnum):
    """A raw column's role among the model's inputs (equal to its name as text, as records and JSON hold it)."""

    CATEGORICAL = "categorical"
    NUMERICAL = "numerical"
    MULTI_HOT = "multi_hot"
    TIME = "time"  # a timestamp, read as parts of time (``preprocess/time_parts.py``)


def label_of(values: pl.Expr, name: str, hint: str = "") -> tuple[pl.Expr, pl.Expr]:
    """A label column of any type (text, numbers, booleans) as 1/0 (UInt8) and the problem of each row whose label
    is none (a String, null where fine); ``hint`` is added to the problem's words."""
    text = values.cast(pl.String).str.to_lowercase()
    problem = (
        pl.when(values.is_null())
        .then(pl.lit(f"{name}: missing label"))
        .when(~text.is_in([*CLICKS, *NON_CLICKS]))
        .then(pl.format(LABEL_PROBLEM.format(name=name, value="{}") + hint, values.cast(pl.String)))
    )
    return text.is_in(list(CLICKS)).cast(pl.UInt8), problem
