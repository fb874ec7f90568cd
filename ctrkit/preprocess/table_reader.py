"""Reading a user's table: one set of rules for every command that reads a CSV or Parquet file of rows
(``preprocess table``, ``predict --input``).

CSV, as RFC 4180 writes it, plain or gzip, with a header (or, for a source whose files have none, Criteo's days, the
columns it names: ``CsvRecords``'s ``names``):

* the separator is one byte, named as itself or as ``tab`` / ``\\t`` (``separator_char``);
* the header names each column once (a name given twice is refused; an unnamed first column, the row index pandas
  and R write, is allowed); a UTF-8 byte-order mark before it is dropped;
* every record has as many fields as the header: one with more or fewer is refused, naming its physical line
  (a value holding the separator must be quoted);
* a quote opens a value only at its start, and closes it only at its end (a quote inside a quoted value is
  doubled); any other quote is refused, naming its line, and so is a quote that never closes;
* a blank line (nothing, or a lone carriage return) is no record: it is skipped, everywhere; lines that end in a
  lone carriage return (classic Mac OS) are refused, naming the conversion;
* text is UTF-8: other bytes are refused, naming their line (a UTF-16 file by its byte-order mark).

Parquet: a column of lists is a multi-hot column's; lists where a single value is due, structs, fixed arrays and
lists of lists are refused, naming the column.

The records are checked in one vectorised pass over the bytes (NumPy), a piece of ``CHUNK_BYTES`` at a time, cut
at a record's end; Polars then parses pieces that are known to be well formed. Every error is one line naming the
file and the physical line (header = line 1).
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

CHUNK_BYTES = 8 << 20  # a CSV is checked and parsed this much at a time, cut at a record's end
PARQUET_SUFFIXES = (".parquet", ".pq")
PARQUET_READ_ROWS = 1 << 18  # a Parquet file is read this many rows at a time (Polars' row group size)
_QUOTE, _NEWLINE, _CR = ord('"'), ord("\n"), ord("\r")
_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # little- and big-endian
_SEPARATOR_NAMES = {"tab": "\t", "\\t": "\t"}


def separator_char(text: str, what: str = "the CSV separator") -> str:
    """The CSV field separator ``text`` names: one single-byte character, or ``tab`` / ``\\t`` for a tab (as a
    shell passes it). Raises ValueError for anything else, naming the setting ``what``."""
    char = _SEPARATOR_NAMES.get(text, text)
    if len(char.encode("utf-8")) != 1 or char in ('"', "\n", "\r"):
        raise ValueError(f"{what} must be one byte other than a quote or a line end (or 'tab' or '\\t'), got "
                         f"{text!r}")  # fmt: skip
    return char


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() in PARQUET_SUFFIXES


# how a user's table names its separator, said where a header reads as one column of names separated otherwise
SEPARATOR_FLAGS = "preprocess table --csv-separator '{0}', predict --separator '{0}'"


def header_names(path: Path, separator: str, separator_flags: str | None = SEPARATOR_FLAGS) -> list[str]:
    """The header's column names, checked (UTF-8, no name twice). ``separator_flags``: the flags that read a file of
    another separator (``{0}`` the separator), None where the command reads ``separator`` alone."""
    with open_bytes(path) as f:
        return _header(path, _first_record(f), separator, separator_flags)


def open_bytes(path: Path):
    """``path`` as a binary file, decompressed where it is gzip (by its first bytes, whatever its name)."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def _first_record(f) -> bytes:
    """The first record of a binary file, its newline included (lines joined while a quote is open)."""
    line = f.readline()
    while line.count(b'"') % 2 and (more := f.readline()):
        line += more
    return line


def check_text(path: Path, record: bytes) -> None:
    """Refuses a file whose first record (``record``, its bytes up to its first newline) shows it is not text by
    these rules, whatever its source: UTF-16 (by its byte-order mark), or lines that end in a lone carriage return
    (a lone CR inside a quoted value is a value's); a one-line ValueError naming the file and the conversion."""
    fixed = f"fixed{path.suffix or '.csv'}"
    if record.startswith(_UTF16_BOMS):
        raise ValueError(f"{path}:1: the file is UTF-16 (it starts with a UTF-16 byte-order mark); expected UTF-8: "
                         f"convert it, e.g. iconv -f UTF-16 -t UTF-8 {path.name} > {fixed}")  # fmt: skip
    line = record.rstrip(b"\r\n")
    if b"\r" in line and line.count(b'"') % 2 == 0 and b'"' not in line.split(b"\r", 1)[0]:
        raise ValueError(f"{path}:1: lines end in a lone carriage return (\\r, as classic Mac OS wrote them); expected "
                         f"\\n or \\r\\n: convert the file, e.g. tr '\\r' '\\n' < {path.name} > {fixed}")  # fmt: skip


def _header(path: Path, record: bytes, separator: str, separator_flags: str | None = SEPARATOR_FLAGS) -> list[str]:
    record = record.removeprefix(_BOM)
    check_text(path, record)
    try:
        text = record.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}:1: the header holds bytes that are not UTF-8 ({record[e.start : e.start + 4]!r} "
                         f"at byte {e.start + 1})") from None  # fmt: skip
    if not text.strip("\r\n"):
        raise ValueError(f"{path}: holds no header (expected a first line naming the columns)")
    line = text.rstrip("\r\n")
    try:
        names = next(csv.reader([line], delimiter=separator))
    except csv.Error as e:
        raise ValueError(f"{path}:1: the header cannot be read as CSV ({e})") from None
    if len(names) == 1:  # one column: maybe a file of another separator
        for other in (";", "\t", "|", ","):
            if other != separator and len(next(csv.reader([line], delimiter=other))) > 1:
                shown = "tab" if other == "\t" else other
                said = "tab" if separator == "\t" else f"'{separator}'"
                how = (
                    f"read the file with the separator '{shown}' ({separator_flags.format(shown)})"
                    if separator_flags is not None
                    else f"this command reads files separated by {said} only"
                )
                raise ValueError(f"{path}:1: the header is one column, '{line[:60]}', of names separated by '{shown}': "
                                 + how)  # fmt: skip
    seen: dict[str, int] = {}
    for i, name in enumerate(names, start=1):
        if name in seen and name != "":
            raise ValueError(f"{path}:1: column '{name}' appears twice in the header (fields {seen[name]} and {i}); "
                             "rename one of them")  # fmt: skip
        seen.setdefault(name, i)
    return names


def _headerless(path: Path, record: bytes, separator: str, names: Sequence[str]) -> list[str]:
    """The columns of a file without a header whose first record is ``record``: ``names``, or ``names`` but the
    first where the record holds one field fewer."""
    if not record.strip(b"\r\n"):
        raise ValueError(f"{path}: holds no rows")
    check_text(path, record)
    fields = record.rstrip(b"\r\n").count(separator.encode()) + 1
    if fields == len(names):
        return list(names)
    if fields == len(names) - 1:
        return list(names[1:])
    name = {"\t": "tab", ",": "comma"}.get(separator, repr(separator))
    raise ValueError(f"{path}:1: {fields} {name}-separated fields; expected {len(names)} ({', '.join(names[:3])}, ..., "
                     f"{names[-1]}) or {len(names) - 1} (without {names[0]})")  # fmt: skip


@dataclass(frozen=True)
class Piece:
    """Whole, checked records of a CSV: their bytes (blank lines left out; each record ends in a newline) and the
    physical line each starts on."""

    data: bytes
    lines: np.ndarray
    starts: np.ndarray  # the byte each record starts at in ``data``


class CsvRecords:
    """A CSV file's records, checked against the rules above a piece at a time (``pieces``). ``names``: the
    columns of a file without a header (Criteo's days), whose records hold them all or all but the first (a log's
    unlabeled rows, as Criteo's test days are); None: the first record is the header."""

    def __init__(self, path: Path, separator: str, chunk_bytes: int | None = None,
                 names: Sequence[str] | None = None):  # fmt: skip
        self.path = Path(path)
        self.separator = separator_char(separator)
        self.chunk_bytes = chunk_bytes or CHUNK_BYTES
        with open_bytes(self.path) as f:
            first = _first_record(f)
        if names is None:
            self.names = _header(self.path, first, self.separator)
            self.header = first.removeprefix(_BOM)
            self.header_bytes = len(first)
            self.header_lines = first.count(b"\n")
        else:
            self.names = _headerless(self.path, first, self.separator, names)
            self.header, self.header_bytes, self.header_lines = b"", 0, 0

    def pieces(self) -> Iterator[Piece]:
        sep = ord(self.separator)
        line = 1 + self.header_lines
        with open_bytes(self.path) as f:
            f.seek(self.header_bytes)
            carry = b""
            while True:
                chunk = f.read(self.chunk_bytes)
                final = not chunk
                data = carry + chunk
                if not data:
                    return
                piece, used, lines_used = self._check(data, sep, line, final)
                carry, line = data[used:], line + lines_used
                del data, chunk  # only the piece is held while it is parsed
                if piece is not None:
                    yield piece
                    piece = None
                if final:
                    return

    def _problem(self, line: int, what: str) -> ValueError:
        return ValueError(f"{self.path}:{line}: {what}")

    def _check(self, data: bytes, sep: int, line0: int, final: bool) -> tuple[Piece | None, int, int]:
        """The whole records at the start of ``data`` (the file's lines from ``line0``): the piece, the bytes it
        took and the newlines in them. ``final``: ``data`` runs to the file's end."""
        a = np.frombuffer(data, np.uint8)
        newlines = np.flatnonzero(a == _NEWLINE)
        quotes = a == _QUOTE
        outside = None  # the quote state before each byte: separators and newlines count outside quotes only
        if quotes.any():
            outside = ((np.cumsum(quotes, dtype=np.uint8) - quotes) & 1) == 0
            ends = newlines[outside[newlines]]
        else:
            quotes, ends = None, newlines  # (no byte array held that says nothing)
        if final and (not len(ends) or ends[-1] != len(a) - 1):  # the last record, without its newline
            if outside is not None and np.count_nonzero(quotes) % 2:
                self._check_quotes(a, quotes, outside, sep, newlines, line0)  # a stray quote, else one left open
                start = int(ends[-1]) + 1 if len(ends) else 0
                where = line0 + int(np.searchsorted(newlines, start))
                raise self._problem(where, 'a quoted value is never closed (a quote inside a value is doubled: "")')
            data += b"\n"
            a = np.frombuffer(data, np.uint8)
            newlines = np.append(newlines, len(a) - 1)
            ends = np.append(ends, len(a) - 1)
            if outside is not None:
                quotes, outside = np.append(quotes, False), np.append(outside, True)
        if not len(ends):
            return None, 0, 0  # a record longer than the piece: read on
        cut = int(ends[-1]) + 1
        if outside is not None:
            self._check_quotes(a[:cut], quotes[:cut], outside[:cut], sep, newlines, line0)
        starts = np.concatenate([[0], ends[:-1] + 1])
        lines = line0 + np.searchsorted(newlines, starts)
        seps = np.flatnonzero(a[:cut] == sep)
        if outside is not None:
            seps = seps[outside[seps]]
        fields = np.searchsorted(seps, ends) - np.searchsorted(seps, starts) + 1
        lengths = ends - starts
        blank = (lengths == 0) | ((lengths == 1) & (a[starts] == _CR))
        wrong = np.flatnonzero((fields != len(self.names)) & ~blank)
        if len(wrong):
            i = int(wrong[0])
            name = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "bar"}.get(self.separator, repr(self.separator))
            raise self._problem(int(lines[i]), f"{int(fields[i])} {name}-separated fields, the header has "
                                f"{len(self.names)} (a value holding the separator must be quoted)")  # fmt: skip
        body = data[:cut]
        if blank.any():
            keep = ~blank
            body = b"".join(data[s : e + 1] for s, e in zip(starts[keep].tolist(), ends[keep].tolist()))
            lines, starts = lines[keep], np.concatenate([[0], np.cumsum(lengths[keep] + 1)[:-1]])
        piece = Piece(body, lines, starts) if len(lines) else None
        return piece, cut, int(np.searchsorted(newlines, cut))

    def _check_quotes(
        self, a: np.ndarray, quotes: np.ndarray, outside: np.ndarray, sep: int, newlines: np.ndarray, line0: int
    ) -> None:
        """Refuses a quote that opens a value anywhere but at its start, or closes one anywhere but at its end."""
        at = np.flatnonzero(quotes)
        opening, closing = at[outside[at]], at[~outside[at]]
        before = a[np.maximum(opening - 1, 0)]
        bad_open = opening[(opening > 0) & (before != sep) & (before != _NEWLINE) & (before != _QUOTE)]
        after = a[np.minimum(closing + 1, len(a) - 1)]
        bad_close = closing[(closing + 1 < len(a)) & (after != sep) & (after != _NEWLINE) & (after != _CR)
                            & (after != _QUOTE)]  # fmt: skip
        bad = np.concatenate([bad_open, bad_close])
        if len(bad):
            where = line0 + int(np.searchsorted(newlines, int(bad.min())))
            raise self._problem(
                where,
                "a quote inside an unquoted value, or text after a quoted value's closing "
                'quote (a value holding quotes is quoted whole, its quotes doubled: "a ""b""")',
            )

    def utf8_problem(self, piece: Piece) -> ValueError | None:
        """The first line of ``piece`` that is not UTF-8, as an error; None where all of it is."""
        try:
            piece.data.decode("utf-8")
        except UnicodeDecodeError as e:
            record = int(np.searchsorted(piece.starts, e.start, side="right")) - 1
            line = int(piece.lines[record]) + piece.data.count(b"\n", int(piece.starts[record]), e.start)
            return self._problem(line, f"bytes that are not UTF-8 ({piece.data[e.start : e.start + 4]!r})")
        return None

    def parse(self, piece: Piece, null_values: Sequence[str], columns: Sequence[str] | None = None,
              infer: bool = False) -> pl.DataFrame:  # fmt: skip
        """``piece``'s records as a frame: text (``infer`` False) or the types Polars infers over all of them (the
        header parsed with them, as Polars names columns)."""
        if infer and self.header:
            source, named = io.BytesIO(self.header + piece.data), {"infer_schema_length": None}
            chosen = list(columns) if columns is not None else None
        else:  # the names given: no copy of the piece behind a header
            labels = [n or f"__ctrkit_unnamed_{i}" for i, n in enumerate(self.names)]
            typed = {"infer_schema_length": None} if infer else {"infer_schema": False}
            source, named = piece.data, {**typed, "has_header": False, "new_columns": labels}
            chosen = [self.names.index(c) for c in columns] if columns is not None else None
        try:
            frame = pl.read_csv(
                source,
                separator=self.separator,
                null_values=list(null_values) or None,
                columns=chosen,
                **named,
            )
        except pl.exceptions.PolarsError as e:
            raise self.utf8_problem(piece) or ValueError(
                f"{self.path}:{int(piece.lines[0])}..: cannot be read as CSV: {str(e).strip().splitlines()[0]}"
            ) from None
        if len(frame) != len(piece.lines):  # the rules above and Polars' parser part ways
            raise ValueError(f"{self.path}:{int(piece.lines[0])}..: {len(frame):,} records parsed where "
                             f"{len(piece.lines):,} were found; check the quotes")  # fmt: skip
        return frame


def read_table(path: Path, separator: str, null_values: Sequence[str], names: Sequence[str] | None = None
               ) -> tuple[pl.DataFrame, np.ndarray]:  # fmt: skip
    """A whole table (types inferred over all its rows, as Polars infers them) and the physical line (CSV) or row
    (Parquet) of each of its rows; ``names``: a headerless file's columns (``CsvRecords``)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: input file not found")
    if path.is_dir():
        raise ValueError(f"{path}: is a directory; expected a CSV or Parquet file")
    if is_parquet(path):
        try:
            frame = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError) as e:
            raise ValueError(f"{path}: cannot be read as Parquet: {str(e).strip().splitlines()[0]}") from None
        check_parquet_types(path, frame.schema)
        return frame, np.arange(1, 1 + len(frame), dtype=np.int64)
    records = CsvRecords(path, separator, names=names)
    lines, kept = [], 0
    for piece in records.pieces():  # the checks, a piece at a time
        lines.append(piece.lines)
        kept += len(piece.data)
    if not lines:
        return pl.DataFrame(schema={n: pl.String for n in records.names}), np.zeros(0, np.int64)
    lines = np.concatenate(lines)
    mapped = names is None and kept - (path.stat().st_size - records.header_bytes) in (0, 1)
    if mapped:  # a plain file with a header and no blank line left out: Polars maps the file
        try:
            text = pl.read_csv(path, separator=records.separator, null_values=list(null_values) or None,
                               infer_schema=False)  # fmt: skip
        except pl.exceptions.PolarsError:
            text = None  # the pieces say where
        if text is not None and len(text) == len(lines):
            frame = inferred_types(text)
            if frame is None:  # a value the types' casts read otherwise than the reader would: the reader decides
                frame = pl.read_csv(path, separator=records.separator, null_values=list(null_values) or None,
                                    infer_schema_length=None)  # fmt: skip
            return frame, lines
    pieces = list(records.pieces())
    offsets = np.cumsum([0] + [len(p.data) for p in pieces[:-1]])
    whole = Piece(b"".join(p.data for p in pieces), lines,
                  np.concatenate([p.starts + o for p, o in zip(pieces, offsets)]))  # fmt: skip
    del pieces
    frame = inferred_types(records.parse(whole, null_values))
    return (frame if frame is not None else records.parse(whole, null_values, infer=True)), lines


def inferred_types(text: pl.DataFrame) -> pl.DataFrame | None:
    """``text`` (every column text, as read without inference) with each column in the type Polars' CSV reader infers
    over every row (``infer_schema_length=None``): Polars gives each value a type and a column the one type that holds
    all of its values' types, so the column's distinct values decide it as its rows do, and the reader's own inference
    is run on those alone. Over every row of a wide file that inference took 9x the time of reading the text
    (docs/decisions/criteo-through-tables.md). None where a cast to the type refuses a value (the caller then reads
    with the reader's inference)."""
    columns = []
    for name in text.columns:
        column = text[name]
        distinct = column.drop_nulls().unique()
        if not len(distinct):
            columns.append(column)
            continue
        values = pl.DataFrame({"v": distinct}).write_csv(quote_style="necessary").encode()
        dtype = pl.read_csv(io.BytesIO(values), infer_schema_length=None).schema["v"]
        try:
            if dtype == pl.String:
                columns.append(column)
            elif dtype in (pl.Int64, pl.Float64):
                columns.append(column.cast(dtype))
            elif dtype == pl.Boolean:
                columns.append(column.str.to_lowercase().replace_strict({"true": True, "false": False},
                                                                        return_dtype=pl.Boolean))  # fmt: skip
            else:
                return None
        except pl.exceptions.PolarsError:
            return None
    return text.with_columns(columns)  # (a new frame of the columns would rename one with no name)


def check_parquet_types(path: Path, schema: Mapping[str, pl.DataType], lists: Iterable[str] | None = None) -> None:
    """Refuses a Parquet column of a type no column role takes: structs, fixed arrays, lists of lists, and (with
    ``lists``, the columns that may hold lists) a list where one value is due."""
    allowed = None if lists is None else set(lists)
    for name, dtype in schema.items():
        nested = isinstance(dtype, pl.List) and isinstance(dtype.inner, (pl.List, pl.Array, pl.Struct))
        if nested or isinstance(dtype, (pl.Struct, pl.Array)):
            raise ValueError(f"{path}: column '{name}' is {dtype}; expected numbers, text, booleans, or a list of ids "
                             "or text (multi-hot)")  # fmt: skip
        if isinstance(dtype, pl.List) and allowed is not None and name not in allowed:
            raise ValueError(f"{path}: column '{name}' is {dtype}, a list, where the model reads one value a row "
                             "(only a multi-hot column holds lists)")  # fmt: skip


def table_blocks(
    path: Path, columns: Sequence[str], separator: str, null_values: Sequence[str], rows: int,
    lists: Iterable[str] = (), names: Sequence[str] | None = None,
) -> Iterator[tuple[pl.DataFrame, np.ndarray]]:  # fmt: skip
    """The file's ``columns`` in blocks of at most ``rows`` rows, in file order, each with the physical line (CSV,
    values as text) or row (Parquet, its types) of its rows. Read a piece at a time, never ahead of the blocks asked
    for, so memory does not grow with the file. ``lists``: the columns that may be Parquet lists; ``names``: a
    headerless CSV's columns (``CsvRecords``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: input file not found")
    if is_parquet(path):
        frame = pl.scan_parquet(path)
        try:
            schema = frame.collect_schema()
        except (OSError, pl.exceptions.PolarsError) as e:
            raise ValueError(f"{path}: not a readable Parquet file: {str(e).strip().splitlines()[0]}") from None
        _check_columns(path, list(schema.names()), columns)
        check_parquet_types(path, {c: schema[c] for c in columns}, lists)
        start = 0
        while True:
            piece = frame.select(columns).slice(start, PARQUET_READ_ROWS).collect()
            if not len(piece):
                return
            lines = np.arange(start + 1, start + 1 + len(piece), dtype=np.int64)
            for a in range(0, len(piece), rows):
                yield piece.slice(a, rows), lines[a : a + rows]
            start += len(piece)
    records = CsvRecords(path, separator, names=names)
    _check_columns(path, records.names, columns)
    for piece in records.pieces():
        frame, lines = records.parse(piece, null_values, columns), piece.lines
        piece = None  # its bytes, freed before the blocks are scored
        for a in range(0, len(frame), rows):
            yield frame.slice(a, rows), lines[a : a + rows]


def table_columns(path: Path, separator: str, names: Sequence[str] | None = None) -> list[str]:
    """The names of a CSV file's header (checked), of a headerless CSV's records (``names``: ``CsvRecords``) or of
    a Parquet file's columns."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: input file not found")
    if not is_parquet(path):
        return CsvRecords(path, separator, names=names).names
    try:
        return list(pl.scan_parquet(path).collect_schema().names())
    except (OSError, pl.exceptions.PolarsError) as e:
        raise ValueError(f"{path}: not a readable Parquet file: {str(e).strip().splitlines()[0]}") from None


def _check_columns(path: Path, header: Sequence[str], columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in header]
    if missing:
        raise ValueError(f"{path}: has no column {', '.join(repr(c) for c in missing)} (columns: {', '.join(header)})")
