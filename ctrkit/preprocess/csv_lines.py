"""Where things are in a CSV file, for messages that name a line: its header's fields, the line each record
starts on (a quoted field may hold newlines, so records and lines part ways), and the first line Polars could
not read (bytes that are not UTF-8, more fields than the header). Python's ``csv`` module reads the file
again only where these are needed: a file whose fields hold newlines, or one that failed to read."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def _reader(path: Path, separator: str, errors: str = "strict"):
    f = open(path, newline="", encoding="utf-8", errors=errors)
    return f, csv.reader(f, delimiter=separator)


def header_fields(path: Path, separator: str) -> list[str]:
    """The header's field names (a file that does not decode is read with replacement characters here)."""
    f, reader = _reader(path, separator, "replace")
    with f:
        return next(reader, [])


def duplicate_header_problem(path: Path, separator: str) -> str | None:
    """A one-line message naming the first column name the header repeats, or None."""
    seen: dict[str, int] = {}
    for i, name in enumerate(header_fields(path, separator), start=1):
        if name in seen and name != "":
            return (f"{path}:1: column '{name}' appears twice in the header (fields {seen[name]} and {i}); rename "
                    "one of them")  # fmt: skip
        seen.setdefault(name, i)
    return None


def record_lines(path: Path, separator: str) -> np.ndarray:
    """The line (header = line 1) each data record starts on, in order."""
    f, reader = _reader(path, separator, "replace")
    starts = []
    with f:
        next(reader, None)
        line = reader.line_num + 1
        for _ in reader:
            starts.append(line)
            line = reader.line_num + 1
    return np.asarray(starts, dtype=np.int64)


def locate_problem(path: Path, separator: str) -> str | None:
    """``LINE: what`` for the first line that is not UTF-8 or whose record has more fields than the header;
    None when neither is found."""
    with open(path, "rb") as raw:
        for number, line in enumerate(raw, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return f"{number}: bytes that are not UTF-8 ({line[e.start : e.start + 4]!r} at byte {e.start + 1})"
    f, reader = _reader(path, separator)
    with f:
        try:
            width, start = len(next(reader, [])), 2
            for record in reader:
                if len(record) > width:
                    return f"{start}: {len(record)} fields, the header has {width}"
                start = reader.line_num + 1
        except csv.Error as e:
            return f"{reader.line_num}: {e}"
    return None


def has_newlines_in_fields(text_columns: list) -> bool:
    """Whether any of these Polars string Series holds a newline (so records span several lines)."""
    return any(bool(s.str.contains("\n", literal=True).any()) for s in text_columns)
