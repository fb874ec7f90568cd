"""Property-based: generated tables (text, integer, float, timestamp and multi-hot columns, missing values, four
separators, two quoting styles) either make a dataset or are refused in one line (exit 2, no traceback); a model
trained on the dataset scores the raw test file (`predict --input`, the same separator) as it scores the
dataset's test rows (`predict --dataset`), to 1e-6.

Planted fault the property catches (`test_a_planted_fault_is_caught`): predict's file reader handing a block's rows
over in reverse (a one-line mutation of `score_file`'s reading)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import run_cli

SEPARATORS = {",": ",", ";": ";", "\t": "tab", "|": "|"}
WORDS = ("red", "green", "blue", "a b", "x,y", 'say "hi"', "ünï", "")
FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d", "%d.%m.%Y %H:%M")


@st.composite
def tables(draw):
    """A table of 40-160 rows (its last quarter the test file), its separator and quoting, and its column roles."""
    n = draw(st.integers(40, 160))
    columns: dict[str, list] = {"clicked": [draw(st.integers(0, 1)) for _ in range(n)]}
    columns["clicked"][:2] = [0, 1]  # both classes
    flags: list[str] = []
    for k in range(draw(st.integers(1, 3))):
        columns[f"text{k}"] = [draw(st.sampled_from(WORDS)) or None for _ in range(n)]
    for k in range(draw(st.integers(0, 2))):
        missing = draw(st.floats(0, 0.5))
        columns[f"amount{k}"] = [None if draw(st.floats(0, 1)) < missing else draw(
            st.floats(-1e6, 1e6, allow_nan=False, width=32)) for _ in range(n)]  # fmt: skip
    if draw(st.booleans()):
        columns["code"] = [draw(st.integers(0, 30)) for _ in range(n)]
        flags += ["--integers", draw(st.sampled_from(["categorical", "numerical"]))]
    separator = draw(st.sampled_from(list(SEPARATORS)))
    if draw(st.booleans()):
        start, fmt = datetime(2026, 1, 1), draw(st.sampled_from(FORMATS))
        columns["when"] = [(start + timedelta(minutes=37 * i)).strftime(fmt) for i in range(n)]
    if separator != "|" and draw(st.booleans()):
        columns["tags"] = ["|".join(draw(st.lists(st.sampled_from(("s", "t", "u")), max_size=3, unique=True)))
                           for _ in range(n)]  # fmt: skip
        flags += ["--multi-hot", "tags"]
    quote = draw(st.sampled_from(["necessary", "always"]))
    return pl.DataFrame(columns, strict=False), separator, quote, flags


def check_table(work, table: pl.DataFrame, separator: str, quote: str, flags: list[str], capsys) -> str:
    """The property for one table; returns what happened (an event)."""
    test_rows = max(1, table.height // 4)
    for name, part in (("train.csv", table.head(table.height - test_rows)), ("test.csv", table.tail(test_rows))):
        part.write_csv(work / name, separator=separator, quote_style=quote)
    out = work / "data"
    sep = ["--csv-separator", SEPARATORS[separator]]
    code, stdout, stderr = run_cli("preprocess", "table", work / "train.csv", "--test-files", work / "test.csv",
                                   "--out", out, "--label", "clicked", "--overwrite", "--no-progress", *sep, *flags,
                                   capsys=capsys)  # fmt: skip
    assert code in (0, 2) and "Traceback" not in stderr, (code, stderr)
    if code == 2:
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert lines[-1].startswith("ctrkit preprocess: error: "), stderr
        said = lines[-1].split(": error: ", 1)[1].replace(str(work), "")
        return "refused in one line: " + re.sub(r"[0-9]+", "N", said)[:70]
    checkpoint = work / "m.pt"
    code, _, stderr = run_cli("train", "--dataset", out, "--max-steps", 3, "--batch-size", 32, "--embedding-dim", 4,
                              "--bottom-mlp", "8,4", "--top-mlp", "8,1", "--no-progress", "--save-checkpoint",
                              checkpoint, capsys=capsys)  # fmt: skip
    assert code == 0, stderr
    assert run_cli("predict", "--checkpoint", checkpoint, "--dataset", out, "--out", work / "ref.npy", "--no-progress",
                   capsys=capsys)[0] == 0  # fmt: skip
    (work / "scores.csv").unlink(missing_ok=True)
    code, _, stderr = run_cli("predict", "--checkpoint", checkpoint, "--input", work / "test.csv", "--out",
                              work / "scores.csv", "--separator", SEPARATORS[separator], "--no-progress",
                              capsys=capsys)  # fmt: skip
    assert code == 0, stderr
    scores = pl.read_csv(work / "scores.csv")["probability"].to_numpy()
    np.testing.assert_allclose(scores, np.load(work / "ref.npy").ravel(), atol=1e-6)
    return "scored as the dataset"


@settings(max_examples=max(5, settings.default.max_examples // 5), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(drawn=tables())
def test_a_generated_table_makes_a_dataset_its_model_scores_raw_or_is_refused_in_one_line(drawn, tmp_path, capsys):
    event(check_table(tmp_path, *drawn, capsys))


def test_a_planted_fault_is_caught(tmp_path, capsys, monkeypatch):
    """A one-line mutation of predict's reader of a file (``score_file.table_blocks``): a block's rows read in
    reverse."""
    from ctrkit.serve import score_file

    table = pl.DataFrame({"clicked": [i % 2 for i in range(80)], "text0": [["red", "blue", "x,y"][i % 3] for i in
                          range(80)], "text1": [["a", "b"][i % 5 // 3] for i in range(80)]})  # fmt: skip
    assert check_table(tmp_path, table, ",", "necessary", [], capsys) == "scored as the dataset"
    real = score_file.table_blocks

    def reversed_blocks(*args, **kwargs):
        for block, lines in real(*args, **kwargs):
            yield block.reverse(), lines[::-1]

    monkeypatch.setattr(score_file, "table_blocks", reversed_blocks)
    with pytest.raises(AssertionError):
        check_table(tmp_path, table, ",", "necessary", [], capsys)
