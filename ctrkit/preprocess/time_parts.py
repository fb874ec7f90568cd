"""A timestamp column read as the parts of time that clicks depend on (the hour of the day, the day of the week, ...),
each a small categorical feature: the one reading of a timestamp, for ``preprocess table`` and for every scorer of raw
rows (``predict --input``, ``ctrkit serve``, the Triton Python-backend model), which apply it through the carried
``RowTransform``.

A timestamp is text in one format, chosen when the table is preprocessed from the first value (``choose_format``;
``FORMATS``, or the user's) and carried with the model, or a Parquet datetime (read as its text,
``2026-03-02 18:04:05.000000``), or an integer count of seconds or milliseconds since 1970 (``UNIX_FORMATS``). The
hour and day are those of the clock the text was written in: an offset (``+02:00``) or ``Z`` at its end is left out,
since a click depends on its viewer's evening, not on UTC's."""

from __future__ import annotations

import polars as pl

# part -> its value (an integer) of a datetime expression
PARTS = {
    "hour": lambda t: t.dt.hour(),  # 0-23
    "weekday": lambda t: t.dt.weekday(),  # 1 (Monday) - 7
    "hour_of_week": lambda t: (t.dt.weekday().cast(pl.Int32) - 1) * 24 + t.dt.hour().cast(pl.Int32),  # 0-167
    "day": lambda t: t.dt.day(),  # of the month, 1-31
    "month": lambda t: t.dt.month(),  # 1-12
}
DEFAULT_PARTS = ("hour", "weekday")
# the formats tried on a text column's first value, in turn (chrono's: %.f is an optional fraction of a second)
FORMATS = (
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%d %H:%M",
    "%Y/%m/%d %H:%M:%S%.f",
    "%Y/%m/%d %H:%M",
    "%Y%m%d%H%M%S",
    "%Y-%m-%d",
)
UNIX_FORMATS = {"unix": "s", "unix_ms": "ms"}  # integer columns: seconds or milliseconds since 1970-01-01 UTC
_OFFSET = r"^(.*\d:\d\d(?::\d\d(?:\.\d+)?)?)\s*(?:Z|[+-]\d\d(?::?\d\d)?)$"  # a zone after a time of day


def parse(values: pl.Expr, time_format: str) -> pl.Expr:
    """``values`` (text, a datetime, or integers for a ``UNIX_FORMATS`` format) as datetimes; null where missing or
    not a timestamp of ``time_format``."""
    if time_format in UNIX_FORMATS:
        number = values.cast(pl.Int64, strict=False)
        return pl.from_epoch(number, time_unit=UNIX_FORMATS[time_format])
    text = values.cast(pl.String).str.strip_chars().str.replace(_OFFSET, "${1}")
    if "%H" not in time_format:  # a date alone (chrono reads no datetime without a time)
        return text.str.strptime(pl.Date, time_format, strict=False).cast(pl.Datetime("us"))
    return text.str.strptime(pl.Datetime("us"), time_format, strict=False)


def part_text(values: pl.Expr, part: str, time_format: str) -> pl.Expr:
    """A timestamp's ``part`` as the text its vocabulary holds ("18" for 18:04); null where missing or unreadable."""
    return PARTS[part](parse(values, time_format)).cast(pl.String)


def problems(column: str, time_format: str) -> pl.Expr:
    """The problem of a row whose ``column`` holds something that is not a timestamp of ``time_format`` (null where
    fine or missing): a bad row of the table, as a number that is none is."""
    col = pl.col(column)
    return pl.when(col.is_not_null() & parse(col, time_format).is_null()).then(
        pl.format(
            f"{column}: '{{}}' is not a timestamp of the column's format {time_format!r} (--time-format names another)",
            col.cast(pl.String),
        )  # fmt: skip
    )


def choose_format(first: object, dtype: pl.DataType, given: str = "") -> str | None:
    """The format of a column whose first value is ``first`` (read as ``dtype``): ``given`` where the user named one;
    a Parquet date's or datetime's text; else the first of ``FORMATS`` that reads a text ``first``; None where none
    does (an integer column needs a ``UNIX_FORMATS`` format named)."""
    if given:
        return given
    if dtype == pl.Date:
        return "%Y-%m-%d"
    if isinstance(dtype, pl.Datetime):  # its text: 2026-03-02 18:04:05.000000
        return "%Y-%m-%d %H:%M:%S%.f"
    if dtype != pl.String or first is None:
        return None
    return next((fmt for fmt in FORMATS if reads(first, fmt)), None)


def reads(value: object, time_format: str) -> bool:
    """Whether ``value`` (one text) is a timestamp of ``time_format``."""
    frame = pl.Series("v", [value]).cast(pl.String).to_frame()
    return frame.select(parse(pl.col("v"), time_format)).to_series()[0] is not None


def check_format(time_format: str) -> None:
    """Refuses a ``--time-format`` that reads nothing: neither a ``UNIX_FORMATS`` name nor a strftime pattern with a
    field (``%``)."""
    if time_format and time_format not in UNIX_FORMATS and "%" not in time_format:
        raise ValueError(f"`time_format`: expected a strftime pattern such as '%Y-%m-%dT%H:%M:%S' or one of "
                         f"{', '.join(UNIX_FORMATS)}, got {time_format!r}")  # fmt: skip
