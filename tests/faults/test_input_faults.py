"""Input a user may really have: CSVs with quoted newlines, stray bytes, ragged or duplicated columns, huge
numbers, nested Parquet columns, a label of one class, a port out of range. Each is one line naming the
file and line (or the flag), exit 2; or, where the behaviour is intended, it does what the docs say."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tests.conftest import run_cli, run_process, small_model_flags
from tests.faults.conftest import one_line_error

ROWS = [f"{i % 2},{i * 0.5},k{i % 5}" for i in range(60)]


def csv(path, rows, header="label,x,kind"):
    path.write_bytes(header.encode() + b"\n" + b"\n".join(r if isinstance(r, bytes) else r.encode() for r in rows)
                     + b"\n")  # fmt: skip
    return path


def preprocess(src, out, *extra):
    return run_process("preprocess", "table", src, "--out", out, "--label", "label", "--no-progress", *extra)


@pytest.mark.parametrize(
    "case, row, needles",
    [
        ("quoted newline before", None, ("bad.csv:13:", "'zz'")),  # the newline inside quotes counts as a line
        ("not utf-8", b"0,1.5,b\xff\xfe", ("bad.csv:12:", "not UTF-8")),
        ("more fields", "0,1.5,b,extra", ("bad.csv:12:", "4 comma-separated fields, the header has 3")),
        ("fewer fields", "0,1.5", ("bad.csv:12:", "2 comma-separated fields, the header has 3")),
        ("beyond float32", "0,1e300,b", ("bad.csv:12:", "beyond float32")),
    ],
)
def test_a_bad_csv_line_is_named_by_its_line_in_the_file(tmp_path, case, row, needles):
    rows = list(ROWS)
    if case == "quoted newline before":
        rows[3], rows[10] = '1,0.5,"two\nlines"', "0,zz,c"
    else:
        rows[10] = row
    proc = preprocess(csv(tmp_path / "bad.csv", rows), tmp_path / "out", "--categorical", "kind")
    assert proc.returncode == 2, proc.stderr
    one_line_error(proc.stderr, "preprocess", *needles)
    assert "RuntimeWarning" not in proc.stderr and not (tmp_path / "out").exists()


def test_quoted_newlines_keep_bad_row_lines_right_when_skipped(tmp_path):
    rows = list(ROWS)
    rows[3], rows[10] = '1,0.5,"two\nlines"', "0,nan-ish,c"
    proc = preprocess(csv(tmp_path / "t.csv", rows), tmp_path / "out", "--numerical", "x", "--bad-rows", "skip")
    assert proc.returncode == 0, proc.stderr
    rejects = (tmp_path / "out" / "rejects.jsonl").read_text()
    assert '"line_no": 13' in rejects, rejects


def test_a_duplicated_column_name_is_refused_not_renamed(tmp_path):
    proc = preprocess(csv(tmp_path / "dup.csv", ROWS, header="label,x,x"), tmp_path / "out")
    assert proc.returncode == 2
    one_line_error(proc.stderr, "preprocess", "dup.csv:1:", "column 'x' appears twice")


def test_a_parquet_list_of_lists_is_refused_naming_the_column(tmp_path):
    pl.DataFrame({"label": [0, 1] * 30, "x": [1.0] * 60, "tags": [[[1, 2], [3]]] * 60}).write_parquet(tmp_path / "n.pq")
    proc = preprocess(tmp_path / "n.pq", tmp_path / "out")
    assert proc.returncode == 2
    one_line_error(proc.stderr, "preprocess", "n.pq", "column 'tags'", "List(List(Int64))")


def test_preprocess_out_never_holds_its_input(tmp_path, monkeypatch):
    """`--out . --overwrite` in the input's directory is refused before anything is deleted."""
    src = csv(tmp_path / "t.csv", ROWS)
    monkeypatch.chdir(tmp_path)
    proc = preprocess("t.csv", ".", "--overwrite")
    assert proc.returncode == 2 and src.exists()
    one_line_error(proc.stderr, "preprocess", "holds the input t.csv", "would destroy the input")


def test_training_on_labels_of_one_class_is_refused(tmp_path):
    rows = [f"0,{i * 0.5},k{i % 5}" for i in range(200)]
    assert preprocess(csv(tmp_path / "zero.csv", rows), tmp_path / "data").returncode == 0
    proc = run_process("train", "--dataset", tmp_path / "data", "--max-steps", "2", "--no-progress",
                       *small_model_flags())  # fmt: skip
    assert proc.returncode == 2
    one_line_error(proc.stderr, "train", str(tmp_path / "data"), "training labels is 0")


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_one_line(tiny_checkpoint, port):
    proc = run_process("serve", "--checkpoint", tiny_checkpoint, "--port", port)
    assert proc.returncode == 2
    one_line_error(proc.stderr, "serve", "--port", "0 to 65535")


@pytest.mark.parametrize(
    "flag, value, said",
    [("--batch-window-ms", "nan", "expected a finite number"), ("--batch-window-ms", "inf", "expected a finite number"),
     ("--max-body-mb", "inf", "expected a finite number"), ("--body-timeout-s", "1e999", "expected a finite number"),
     ("--header-timeout-s", "nan", "expected a finite number"),
     ("--batch-window-ms", "-1", "expected a number from 0")],
)  # fmt: skip
def test_a_server_setting_that_would_hang_or_crash_it_is_refused(tiny_checkpoint, flag, value, said, capsys):
    code, _, err = run_cli("serve", "--checkpoint", tiny_checkpoint, flag, value, capsys=capsys)
    assert code == 2 and said in err and "Traceback" not in err


def test_export_never_deletes_the_current_directory_nor_a_model_named_like_a_temporary(
    tiny_checkpoint, tmp_path, monkeypatch, capsys
):
    (tmp_path / "keep.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("export", "--checkpoint", tiny_checkpoint, "--format", "onnx", "--out", ".", "--overwrite",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and "is the current directory" in err and (tmp_path / "keep.txt").read_text() == "mine"
    code, _, err = run_cli("export", "--checkpoint", tiny_checkpoint, "--format", "triton", "--out", tmp_path / "repo",
                           "--name", ".ctr.tmp-999999-prod", capsys=capsys)  # fmt: skip
    assert code == 2 and "starts with '.'" in err


def test_predict_writes_the_path_it_names(tiny_dataset, tiny_checkpoint, tmp_path):
    out = tmp_path / "scores"
    proc = run_process("predict", "--checkpoint", tiny_checkpoint, "--dataset", tiny_dataset, "--out", out)
    assert proc.returncode == 0 and f"wrote {out}:" in proc.stdout
    assert out.exists() and not (tmp_path / "scores.npy").exists()
    assert np.load(out).shape == (len(np.load(out)),)
