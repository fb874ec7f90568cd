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

import re
from typing import Literal

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
# integer columns: seconds or milliseconds since 1970-01-01 UTC
UNIX_FORMATS: dict[str, Literal["s", "ms"]] = {"unix": "s", "unix_ms": "ms"}
# a count beyond this is no timestamp of its unit (the year 5138): milliseconds read as seconds would be in the year
# 57,000, and are refused, not read
UNIX_LIMITS = {"unix": 10**11, "unix_ms": 10**14}
# formats of integers (a table's reader reads 20260302180405 as one), tried on a named ``time`` column's first value
INTEGER_FORMATS = {"%Y%m%d%H%M%S": 14, "%Y%m%d": 8}  # format -> its digits
# a value that looks like a date (digits, a separator, digits, the same separator, digits) in none of the formats
_DATE_LIKE = re.compile(r"^(\d{1,4})([/.\-])(\d{1,2})\2(\d{1,4})(?:([ T])(\d{1,2}):(\d\d)(:\d\d)?)?")
_OFFSET = r"^(.*\d:\d\d(?::\d\d(?:\.\d+)?)?)\s*(?:Z|[+-]\d\d(?::?\d\d)?)$"  # a zone after a time of day


def parse(values: pl.Expr, time_format: str) -> pl.Expr:
    """``values`` (text, a datetime, or integers for a ``UNIX_FORMATS`` format) as datetimes; null where missing or
    not a timestamp of ``time_format``."""
    if time_format in UNIX_FORMATS:
        number = values.cast(pl.Int64, strict=False)
        number = pl.when(number.abs() < UNIX_LIMITS[time_format]).then(number)
        return pl.from_epoch(number, time_unit=UNIX_FORMATS[time_format])
    text = values.cast(pl.String).str.strip_chars().str.replace(_OFFSET, "${1}")
    if "%H" not in time_format:  # a date alone (chrono reads no datetime without a time)
        return text.str.strptime(pl.Date, time_format, strict=False).cast(pl.Datetime("us"))
    return text.str.strptime(pl.Datetime("us"), time_format, strict=False)


def part_text(values: pl.Expr, part: str, time_format: str) -> pl.Expr:
    """A timestamp's ``part`` as the text its vocabulary holds ("18" for 18:04); null where missing or unreadable."""
    return PARTS[part](parse(values, time_format)).cast(pl.String)


def choose_format(first: object, dtype: pl.DataType, given: str = "") -> str | None:
    """The format of a column whose first value is ``first`` (read as ``dtype``): ``given`` where the user named one;
    a Parquet date's or datetime's text; else the first of ``FORMATS`` (of ``INTEGER_FORMATS`` for an integer) that
    reads ``first``; None where none does (an integer column of seconds or milliseconds needs its unit named)."""
    if given:
        return given
    if dtype == pl.Date:
        return "%Y-%m-%d"
    if isinstance(dtype, pl.Datetime):  # its text: 2026-03-02 18:04:05.000000
        return "%Y-%m-%d %H:%M:%S%.f"
    if first is None:
        return None
    if dtype.is_integer():
        digits = str(first)
        return next((f for f, n in INTEGER_FORMATS.items() if len(digits) == n and reads(digits, f)), None)
    if dtype != pl.String:
        return None
    return next((fmt for fmt in FORMATS if reads(first, fmt)), None)


def unit_problem(first: object, time_format: str) -> str | None:
    """Why an integer column whose first value is ``first`` is no count of ``time_format``'s unit (None where it is
    one): milliseconds named as seconds are refused, not read in the year 57,000."""
    try:
        value = int(str(first))
    except ValueError:
        return f"its first value {first!r} is no integer count since 1970"
    if abs(value) >= UNIX_LIMITS[time_format]:
        longer = "milliseconds: --time-format unix_ms" if time_format == "unix" else "not milliseconds"
        return f"its first value {value} is beyond the year 5000 as a count of {time_format!r} ({longer})"
    return None


def formats_seen(value: str) -> list[str]:
    """The formats that read ``value``, a date of none of ``FORMATS`` (a day and month given by number, either way
    round where both are at most 12): what a message offers for ``--time-format``; [] where it looks like no date or
    no such format reads it."""
    m = _DATE_LIKE.match(value.strip())
    if m is None:
        return []
    a, sep, b, c = m.group(1), m.group(2), m.group(3), m.group(4)
    clock = "" if m.group(5) is None else m.group(5) + "%H:%M" + (":%S" if m.group(8) else "")
    if len(a) == 4:
        orders = [f"%Y{sep}%m{sep}%d"]
    elif len(c) == 4:
        orders = [o for o, ok in ((f"%d{sep}%m{sep}%Y", int(b) <= 12), (f"%m{sep}%d{sep}%Y", int(a) <= 12)) if ok]
    else:
        return []
    return [o + clock for o in orders if reads(value, o + clock)]


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
