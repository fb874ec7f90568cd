"""The one table reader (``preprocess/table_reader.py``): every malformed CSV refused in one line naming the file
and its physical line, by the whole-table read (`preprocess table`) and the block read (`predict --input`) alike;
blank lines skipped by both; pieces cut only at a record's end; Parquet types checked by column."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ctrkit.data.atomic import check_output
from ctrkit.preprocess.table_reader import (
    CsvRecords,
    read_table,
    separator_char,
    table_blocks,
)
from tests.conftest import run_cli

HEADER = "ts,country,price,clicked"
GOOD = [f"{i},c{i % 3},{i / 4},{i % 2}" for i in range(12)]


def _write(path, lines, tail="\n") -> object:
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + tail.encode())
    return path


def _edited(index: int, text: str | bytes) -> list:
    """The good file's lines with data line ``index`` (0-based; physical line ``index + 2``) replaced."""
    lines = [HEADER, *GOOD]
    lines[index + 1] = text
    return lines


MALFORMED = {
    # case: (the file's lines, the line named, words of the refusal)
    "an unquoted comma": (_edited(2, "2,c2,0.5,0,oops"), 4, "5 comma-separated fields, the header has 4"),
    "a field left out": (_edited(5, "5,c2,1"), 7, "3 comma-separated fields, the header has 4"),
    "a stray quote": (_edited(3, '3,c"0,0.75,1'), 5, "a quote inside an unquoted value"),
    "text after a closing quote": (_edited(3, '3,"c0"x,0.75,1'), 5, "a quote inside an unquoted value"),
    "a quote never closed": (_edited(6, '6,"c0,1.5,0'), 8, "a quoted value is never closed"),
    "bytes not UTF-8": (_edited(9, b"9,c\xff0,2.25,1"), 11, "bytes that are not UTF-8"),
    "a column named twice": ([HEADER + ",price", *(g + ",1" for g in GOOD)], 1, "column 'price' appears twice"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
@pytest.mark.parametrize("chunk", [None, 23])
def test_every_malformed_file_is_refused_naming_its_line_by_both_reads(tmp_path, case, chunk, monkeypatch):
    lines, line, words = MALFORMED[case]
    path = _write(tmp_path / "t.csv", [*lines[:1], '0,"two\nlines",0.0,0', *lines[1:]])  # a record over two lines
    line += 2 if line > 1 else 0  # the record inserted takes lines 2 and 3
    if chunk is not None:  # pieces of a few bytes: a record's checks never depend on where a piece ends
        monkeypatch.setattr("ctrkit.preprocess.table_reader.CHUNK_BYTES", chunk)
    for read in (lambda: read_table(path, ",", ["NA"]),
                 lambda: list(table_blocks(path, ["country", "price"], ",", ["NA"], rows=4))):  # fmt: skip
        with pytest.raises(ValueError) as e:
            read()
        assert str(e.value).startswith(f"{path}:{line}: ") and words in str(e.value), str(e.value)
        assert "\n" not in str(e.value)


def test_a_malformed_row_is_refused_by_preprocess_table_naming_the_line(tmp_path, capsys):
    lines, line, words = MALFORMED["an unquoted comma"]
    path = _write(tmp_path / "t.csv", lines)
    code, _, err = run_cli("preprocess", "table", path, "--out", tmp_path / "d", "--label", "clicked", "--no-progress",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and f"{path}:{line}: {words}" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_blank_lines_are_no_records_for_either_read(tmp_path):
    """Blank lines (empty, a lone CR, the file's end) are skipped; the lines of the other records stay physical."""
    lines = [HEADER, GOOD[0], "", GOOD[1], "\r", '2,"a\n\nb",0.5,0', "", GOOD[3]]
    path = _write(tmp_path / "t.csv", lines, tail="\n\n\n")
    frame, where = read_table(path, ",", [])
    assert frame["ts"].to_list() == [0, 1, 2, 3] and where.tolist() == [2, 4, 6, 10]
    assert frame["country"][2] == "a\n\nb"
    blocks = list(table_blocks(path, ["ts", "country"], ",", [], rows=3))
    assert [b["ts"].to_list() for b, _ in blocks] == [["0", "1", "2"], ["3"]]
    assert np.concatenate([w for _, w in blocks]).tolist() == [2, 4, 6, 10]


def test_pieces_are_cut_only_at_record_ends(tmp_path):
    """A CSV read a few bytes at a time, with quoted fields holding newlines, separators and quotes, gives the rows
    a whole-file read gives, in order."""
    rng = np.random.default_rng(0)
    texts = ["plain", "two\nlines", "a,comma", 'say "hi"', "", 'x"\n"y']
    frame = pl.DataFrame({"id": [str(i) for i in range(300)], "text": [texts[i] for i in rng.integers(0, 6, 300)]})
    frame.write_csv(tmp_path / "t.csv")
    records = CsvRecords(tmp_path / "t.csv", ",", chunk_bytes=37)
    pieces = list(records.pieces())
    assert len(pieces) > 20
    got = pl.concat([records.parse(p, ()) for p in pieces])
    want = pl.read_csv(tmp_path / "t.csv", infer_schema=False)
    assert got.rows() == want.rows()
    lines = np.concatenate([p.lines for p in pieces])
    assert lines[0] == 2 and (np.diff(lines) == 1 + want["text"].str.count_matches("\n").to_numpy()[:-1]).all()
    blocks = list(table_blocks(tmp_path / "t.csv", ["text", "id"], ",", (), rows=7))
    assert max(len(b) for b, _ in blocks) <= 7
    assert pl.concat([b for b, _ in blocks])["id"].to_list() == want["id"].to_list()


def test_separators_and_outputs(tmp_path):
    assert separator_char("tab") == separator_char("\\t") == separator_char("\t") == "\t"
    assert separator_char(";") == ";"
    for bad in ("::", '"', "", "é"):
        with pytest.raises(ValueError, match="must be one byte"):
            separator_char(bad)
    path = _write(tmp_path / "t.csv", [HEADER, *GOOD])
    for out in (path, tmp_path, tmp_path / ".." / tmp_path.name / "t.csv"):
        with pytest.raises(ValueError, match="writing it would destroy the input"):
            check_output(out, [path])
    check_output(tmp_path / "out", [path])  # beside it: fine


def test_parquet_types_are_checked_by_column(tmp_path):
    pl.DataFrame({"country": [["a", "b"], ["c"]], "price": [1.0, 2.0]}).write_parquet(tmp_path / "t.parquet")
    with pytest.raises(ValueError, match="column 'country' is List\\(String\\), a list, where the model reads"):
        list(table_blocks(tmp_path / "t.parquet", ["country", "price"], ",", (), rows=4))
    blocks = list(table_blocks(tmp_path / "t.parquet", ["country", "price"], ",", (), rows=4, lists=["country"]))
    assert blocks[0][0]["country"].to_list() == [["a", "b"], ["c"]] and blocks[0][1].tolist() == [1, 2]
    pl.DataFrame({"s": [{"a": 1}], "label": [1]}).write_parquet(tmp_path / "s.parquet")
    with pytest.raises(ValueError, match="column 's' is Struct"):
        read_table(tmp_path / "s.parquet", ",", ())


def test_a_file_of_another_separator_is_named_with_the_flag_that_reads_it(tmp_path, capsys):
    (tmp_path / "semi.csv").write_text("ts;user_id;clicked\n2026-01-01 00:00:00;u1;0\n2026-01-01 00:01:00;u2;1\n")
    code, _, err = run_cli("preprocess", "table", tmp_path / "semi.csv", "--out", tmp_path / "out", "--label",
                           "clicked", "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 2 and "semi.csv:1: the header is one column" in err and "--csv-separator ';'" in err, err
    code, _, err = run_cli("preprocess", "table", tmp_path / "semi.csv", "--out", tmp_path / "out", "--label",
                           "clicked", "--csv-separator", ";", "--no-progress", capsys=capsys)  # fmt: skip
    assert "the header is one column" not in err  # read with its separator, the header names three columns


# values whose type Polars' reader infers in every way it can: integers (signs, spaces, zeros, one beyond int64),
# floats (exponents, inf, NaN, a bare point), booleans in any case, text, the empty value and a null spelling
TOKENS = ["1", "-2", "+5", " 5", "05", "9223372036854775807", "9223372036854775808", "1.5", ".5", "5.", "-0.0",
          "1e3", "1E-3", "inf", "-inf", "NaN", "nan", "1e400", "true", "False", "TRUE", "abc", "1,5", "0x10", "",
          "NA", "1_000", "12:00"]  # fmt: skip


def _same_as_the_reader(path, pools, rows: int, seed: int) -> None:
    """A table of ``rows`` rows whose column j draws its values from ``pools[j]``, read by ``read_table`` and by
    Polars' reader inferring over every row (the reference): the same frame, types and values."""
    from ctrkit.preprocess.table_reader import read_table

    rng = np.random.default_rng(seed)
    cell = lambda v: f'"{v}"' if "," in v else v  # noqa: E731
    body = "\n".join(",".join(cell(pool[rng.integers(len(pool))]) for pool in pools) for _ in range(rows))
    path.write_text(",".join(f"c{i}" if i else "" for i in range(len(pools))) + "\n" + body + "\n")  # R's unnamed
    frame, _ = read_table(path, ",", ("NA",))
    reference = pl.read_csv(path, null_values=["NA"], infer_schema_length=None)
    assert frame.schema == reference.schema
    assert frame.equals(reference), (frame, reference)


def test_types_are_those_the_reader_infers_over_every_row(tmp_path):
    """``read_table`` decides each column's type on its distinct values (``inferred_types``); the frame is the one
    Polars' own reader gives inferring over every row (names too: the first column has none, as R writes a table),
    whatever the values: each token in a column of its own and
    beside each other, then generated tables. (Two columns at least: a row of one empty value is a blank line, which
    the reader counts as no record.) A planted fault, floats cast through float32, fails it."""
    from hypothesis import given
    from hypothesis import strategies as st

    alone = [[t] for t in TOKENS if t] + [[a, b] for a in TOKENS for b in ("1", "1.5", "true", "abc")]
    _same_as_the_reader(tmp_path / "fixed.csv", [["x"], *alone], 30, 0)
    columns = st.lists(st.sampled_from(TOKENS), min_size=1, max_size=4)  # a column draws from a few of the tokens

    @given(st.lists(columns, min_size=2, max_size=4), st.integers(1, 40), st.integers(0, 2**32 - 1))
    def check(pools, rows, seed):
        _same_as_the_reader(tmp_path / "t.csv", pools, rows, seed)

    check()
