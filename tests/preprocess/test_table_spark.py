"""`preprocess table --engine spark` against the Polars engine: the same dataset, byte for byte, on every kind of
table the suite makes, a second day written `--like` the first included; the same refusals.

A real local Spark session runs (Java 17 is on the machine; PySpark and PyArrow come with ``ctrkit[spark]``).
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from ctrkit.data.split_binary import DataError
from ctrkit.preprocess.like import Like
from ctrkit.preprocess.table import preprocess_table
from ctrkit.preprocess.table_recipe import TableRecipe
from tests.preprocess.test_transform import TABLES, _table
from tests.preprocess.test_value_ids import _household_table

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
from tests.preprocess.test_criteo_spark import MASTER, assert_same_output  # noqa: E402

FLAGS = {  # the CLI flags of TABLES, as the recipe's fields
    "--multi-hot": ("multi_hot", tuple), "--integers": ("integers", str), "--also-categorical": ("also_categorical",
    tuple), "--categorical": ("categorical", tuple), "--raw-ids": ("raw_ids", tuple), "--frequency-threshold":
    ("frequency_threshold", int), "--time": ("time", tuple), "--time-parts": ("time_parts", tuple),
    "--time-format": ("time_format", str),
}  # fmt: skip


def _recipe(flags: list[str]) -> tuple[TableRecipe, dict]:
    fields, kw = {}, {}
    for flag, value in zip(flags[::2], flags[1::2]):
        if flag == "--validation-fraction":
            kw["validation_fraction"] = float(value)
            continue
        name, kind = FLAGS[flag]
        fields[name] = tuple(value.split(",")) if kind is tuple else kind(value)
    return TableRecipe(label="click", **fields), kw


def _both(tmp_path, name: str, files, recipe: TableRecipe, **kw) -> None:
    """The table written by each engine; asserts the same files."""
    for engine in ("polars", "spark"):
        preprocess_table(files, tmp_path / f"{name}-{engine}", recipe, engine=engine, master=MASTER, **kw)
    assert_same_output(tmp_path / f"{name}-polars", tmp_path / f"{name}-spark")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # Spark's scratch files removed


@pytest.mark.parametrize("table", list(TABLES))
def test_every_table_and_its_second_day_byte_for_byte(tmp_path, table):
    make, suffix, flags = TABLES[table]
    frame = make()
    half = len(frame) // 2
    first, second = tmp_path / f"first{suffix}", tmp_path / f"second{suffix}"
    for part, path in ((frame[:half], first), (frame[half:], second)):
        part.write_parquet(path) if suffix == ".parquet" else part.write_csv(path)
    recipe, kw = _recipe(flags)
    _both(tmp_path, "day1", [first], recipe, **kw)
    like = Like.of_dataset(tmp_path / "day1-polars")  # the day-2 transform: the first day's vocabularies, extended
    _both(tmp_path, "day2", [second], TableRecipe(label="click"), like=like)


def test_order_group_test_files_bad_rows_and_the_values_chosen_as_ids(tmp_path):
    """A sort by a column (ties in file order, train before test), a group column, test files, skipped bad rows
    (rejects.jsonl), a validation split; a shuffle; and ``--also-categorical auto`` choosing a column."""
    table = _table().with_columns(pl.col("ts") % 50)  # ties
    text = table.with_columns(pl.col("price").cast(pl.String))
    text = text.with_columns(pl.when(pl.int_range(pl.len()) % 97 == 5).then(pl.lit("cheap")).otherwise("price")
                             .alias("price"))  # fmt: skip
    text[:400].write_csv(tmp_path / "a.csv")
    text[400:500].write_csv(tmp_path / "b.csv")
    text[500:].write_csv(tmp_path / "test.csv")
    recipe = TableRecipe(label="click", categorical=("item",), numerical=("price",), multi_hot=("genres",),
                         order_by="ts", group="user", bad_rows="skip")  # fmt: skip
    files = [tmp_path / "a.csv", tmp_path / "b.csv"]
    _both(tmp_path, "ordered", files, recipe, test_files=[tmp_path / "test.csv"], validation_fraction=0.2)
    assert (tmp_path / "ordered-spark" / "rejects.jsonl").read_text().count("cheap") == 7
    table.write_csv(tmp_path / "all.csv")
    shuffled = TableRecipe(label="click", categorical=("item",), multi_hot=("genres",), drop=("ts",), shuffle_seed=3)
    _both(tmp_path, "shuffled", [tmp_path / "all.csv"], shuffled, test_fraction=0.2)
    households = tmp_path / "households.csv"
    pl.DataFrame(_household_table()).write_csv(households)
    _both(tmp_path, "auto", [households], TableRecipe(label="click", shuffle_seed=0), test_fraction=0.15)
    chosen = json.loads((tmp_path / "auto-spark" / "summary.json").read_text())["value_id_tests"]
    assert [c for c, t in chosen.items() if t["chosen"]] == ["income"]  # and its ids written the same


def test_the_same_refusals_naming_file_and_line(tmp_path):
    rows = _table().drop("ts")
    rows.write_csv(tmp_path / "good.csv")
    bad = rows.with_columns(pl.col("price").cast(pl.String))
    bad = bad.with_columns(
        pl.when(pl.int_range(pl.len()) == 41).then(pl.lit("cheap")).otherwise("price").alias("price")
    )
    bad.write_csv(tmp_path / "bad.csv")
    lines = (tmp_path / "good.csv").read_text().splitlines()
    (tmp_path / "fields.csv").write_text("\n".join(lines[:30] + [lines[30] + ",x"] + lines[31:]) + "\n")
    recipe = TableRecipe(label="click", categorical=("item",), numerical=("price",), multi_hot=("genres",))
    cases = [
        (
            [tmp_path / "good.csv", tmp_path / "bad.csv"],
            DataError,
            "bad.csv:43: column 'price' holds 'cheap'; expected a number",
        ),
        ([tmp_path / "good.csv", tmp_path / "fields.csv"], ValueError, "fields.csv:31: 7 comma-separated fields"),
    ]
    for files, kind, message in cases:
        for engine in ("polars", "spark"):
            with pytest.raises(kind, match=message):
                preprocess_table(files, tmp_path / engine, recipe, engine=engine, master=MASTER)
            assert not (tmp_path / engine).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
