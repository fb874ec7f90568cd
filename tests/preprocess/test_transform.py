"""The preprocessing a model carries (``preprocess/transform.py``): applied to the raw rows a dataset was made from,
it gives the dataset's own ids, numbers and bags, for the table and Criteo recipes; and its stored forms (the
checkpoint's tensors, an export's files) give the same transform back."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.split_binary import open_mapping
from ctrkit.preprocess.polars_engine import preprocess_criteo
from ctrkit.preprocess.transform import (
    CategoricalInput,
    Column,
    NumericalInput,
    RowError,
    RowTransform,
    from_dataset,
    strings,
    utf8,
)
from ctrkit.preprocess.vocabulary import ValueIndex
from tests.conftest import run_cli
from tests.preprocess.test_criteo_polars import SMALL, TEST, TRAIN, write
from tests.preprocess.test_table import _table


def _bags(values: np.ndarray, offsets: np.ndarray, width: int) -> np.ndarray:
    """A multi-hot column of the dataset as the padded (N, width) ids the transform gives (-1 padding)."""
    out = np.full((len(offsets) - 1, width), -1, np.int64)
    for i in range(len(offsets) - 1):
        row = values[offsets[i] : offsets[i + 1]]
        out[i, : len(row)] = row
    return out


def _check_remakes(dataset, rows: pl.DataFrame, bounds: dict[str, tuple[int, int]]) -> RowTransform:
    """The transform applied to ``rows`` equals the dataset's stored inputs in every mapping."""
    transform = from_dataset(dataset)
    spec = FeatureSpec.from_yaml(dataset)
    transform.check_features(spec.summary(), str(dataset))
    for mapping, (lo, hi) in bounds.items():
        stored = open_mapping(spec, mapping)
        numerical, categorical, bags = transform(transform.typed(rows[lo:hi]))
        np.testing.assert_array_equal(categorical, np.stack(stored.categorical, 1).astype(np.int64), err_msg=mapping)
        if stored.numerical is not None:
            np.testing.assert_array_equal(numerical, np.asarray(stored.numerical, np.float32), err_msg=mapping)
        for j, (values, offsets) in enumerate(stored.multi_hot):
            want = _bags(np.asarray(values, np.int64), np.asarray(offsets), bags.shape[2])
            np.testing.assert_array_equal(bags[:, j], want, err_msg=mapping)
    return transform


@pytest.mark.parametrize("flags", [[], ["--raw-ids", "user"]], ids=["vocabularies", "raw-ids"])
def test_table_transform_remakes_the_dataset(tmp_path, flags):
    df = _table()
    df.write_csv(tmp_path / "clicks.csv")
    out = tmp_path / "ds"
    code = run_cli("preprocess", "table", tmp_path / "clicks.csv", "--out", out, "--label", "click", "--categorical",
                   "item", "--multi-hot", "genres", "--drop", "ts", "--also-categorical", "price", "--no-progress",
                   *flags)[0]  # fmt: skip
    assert code == 0
    csv = pl.read_csv(tmp_path / "clicks.csv", infer_schema=False)  # as text, as predict --input reads a CSV
    transform = _check_remakes(out, csv, {"train": (0, 540), "test": (540, 600)})
    assert [f.feature for f in transform.categorical][-1] == "price_id"  # the number's id, from the price column
    roles = {c.name: (c.dtype, c.role) for c in transform.columns}
    assert list(roles) == ["user", "item", "price", "genres", "device"]  # the table's order
    assert roles == {"user": ("String", "categorical"), "item": ("Int64", "categorical"),
                     "device": ("String", "categorical"), "price": ("Float64", "numerical"),
                     "genres": ("String", "multi_hot")}  # fmt: skip
    # the typed Parquet columns give the same as the CSV's text
    typed = pl.read_csv(tmp_path / "clicks.csv")
    for a, b in zip(transform(transform.typed(typed)), transform(transform.typed(csv))):
        np.testing.assert_array_equal(a, b)


def _unicode_table(rows: int = 900, seed: int = 1) -> pl.DataFrame:
    """Text in many scripts, quotes and separators inside values, missing values (empty and NA), booleans, a
    multi-hot column with empty and repeated values, an amount with gaps."""
    rng = np.random.default_rng(seed)
    words = ["São Paulo", "東京", "naïve", 'say "hi"', "a,b", "Ωmega", "🙂", "x y", "NA", ""]
    tags = ["é", "ß", "東", "a", "b", ""]
    return pl.DataFrame(
        {
            "city": [w or None for w in rng.choice(words, rows)],
            "shop": [f"s{i}é" for i in rng.integers(0, 60, rows)],
            "member": rng.choice([True, False], rows),
            "tags": ["|".join(rng.choice(tags, rng.integers(0, 4))) for _ in range(rows)],
            "price": [
                None if m else float(v) for m, v in zip(rng.random(rows) < 0.1, np.round(rng.gamma(2, 3, rows), 2))
            ],
            "click": rng.integers(0, 2, rows),
        }
    )


def _timed_table(rows: int = 900, seed: int = 2) -> pl.DataFrame:
    """A click log with a timestamp (ISO text, some with an offset or Z, a few missing), a shop and an amount."""
    rng = np.random.default_rng(seed)
    seconds = np.sort(rng.integers(0, 21 * 86400, rows))
    ts = (pl.Series(seconds * 1_000_000).cast(pl.Datetime("us")).dt.offset_by("56y2mo1d")).dt.strftime(
        "%Y-%m-%dT%H:%M:%S"
    )
    ends = rng.choice(["", "", "Z", "+02:00", "-0530"], rows)
    return pl.DataFrame({
        "ts": [None if m else t + e for t, e, m in zip(ts, ends, rng.random(rows) < 0.03)],
        "shop": [f"s{i}" for i in rng.integers(0, 40, rows)],
        "price": np.round(rng.gamma(2, 3, rows), 2),
        "click": rng.integers(0, 2, rows),
    })  # fmt: skip


def _unix_table() -> pl.DataFrame:
    frame = _timed_table()
    stamp = frame["ts"].str.slice(0, 19).str.strptime(pl.Datetime("us"), "%Y-%m-%dT%H:%M:%S")
    return frame.with_columns(ts=stamp.dt.epoch("s"))


TABLES = {  # every kind of table the suite makes: (frame, file suffix, flags)
    "timestamps": (_timed_table, ".csv", ["--time-parts", "hour,weekday,hour_of_week,day,month"]),
    "parquet datetimes": (lambda: _timed_table().with_columns(pl.col("ts").str.slice(0, 19).str.strptime(
        pl.Datetime("us"), "%Y-%m-%dT%H:%M:%S")), ".parquet", []),
    "unix seconds": (_unix_table, ".csv", ["--time", "ts", "--time-format", "unix", "--time-parts", "hour_of_week"]),
    "unicode, missing, multi-hot": (_unicode_table, ".csv", ["--multi-hot", "tags"]),
    "numbers as ids": (lambda: _table().drop("ts"), ".csv", ["--integers", "categorical", "--multi-hot", "genres",
                                                              "--also-categorical", "price"]),
    "raw ids": (lambda: _table().drop("ts"), ".csv", ["--categorical", "item", "--multi-hot", "genres", "--raw-ids",
                                                       "user,item", "--validation-fraction", "0.2"]),
    "parquet lists": (lambda: _unicode_table().with_columns(pl.col("tags").str.split("|")), ".parquet",
                      ["--frequency-threshold", "1"]),
}  # fmt: skip


@pytest.mark.parametrize("table", list(TABLES))
@pytest.mark.parametrize("day", ["fitted", "like"])
def test_every_table_written_equals_its_transform_bit_for_bit(tmp_path, table, day):
    """The dataset `preprocess table` writes equals, bit for bit, the carried transform (read back from the dataset's
    files) applied to the raw rows as `predict --input` reads them (the one table reader, in blocks): a table fitted
    on its own, and a second day written `--like` the first day's dataset (every value of the first day keeping its
    id)."""
    from ctrkit.preprocess.table_reader import table_blocks

    make, suffix, flags = TABLES[table]
    frame = make()
    write = lambda f, p: f.write_parquet(p) if suffix == ".parquet" else f.write_csv(p)  # noqa: E731
    path = tmp_path / f"t{suffix}"
    out = tmp_path / "ds"
    if day == "fitted":
        write(frame, path)
        assert run_cli("preprocess", "table", path, "--out", out, "--label", "click", "--no-progress", *flags)[0] == 0
    else:
        half = len(frame) // 2
        write(frame[:half], tmp_path / f"first{suffix}")
        first = tmp_path / "first"
        assert run_cli("preprocess", "table", tmp_path / f"first{suffix}", "--out", first, "--label", "click",
                       "--no-progress", *flags)[0] == 0  # fmt: skip
        frame = frame[half:]
        write(frame, path)
        assert run_cli("preprocess", "table", path, "--out", out, "--label", "click", "--like", first,
                       "--no-progress")[0] == 0  # fmt: skip
        old, new = from_dataset(first).vocabularies, from_dataset(out).vocabularies
        for feature, vocab in old.items():
            kept = vocab.filter(pl.col("id") >= 2).join(new[feature], on="value", how="left", suffix="_new")
            assert (kept["id"] == kept["id_new"]).all(), feature  # learned rows keep their meaning
    transform = from_dataset(out)
    spec = FeatureSpec.from_yaml(out)
    lists = [c.name for c in transform.columns if c.role == "multi_hot"]
    blocks = list(table_blocks(path, transform.column_names, ",", transform.null_values, 256, lists))
    parts = [transform.encode(block) for block, _ in blocks]
    numerical = np.concatenate([p[0] for p in parts])
    categorical = np.concatenate([p[1] for p in parts])
    start = 0
    for mapping in spec.source_spec:
        stored = open_mapping(spec, mapping)
        n = len(stored.labels)
        np.testing.assert_array_equal(np.stack(stored.categorical, 1).astype(np.int64), categorical[start : start + n])
        if stored.numerical is not None:
            want = np.asarray(stored.numerical, np.float32)
            assert want.tobytes() == numerical[start : start + n].tobytes(), mapping  # bit for bit
        for j, (values, offsets) in enumerate(stored.multi_hot):
            flat = np.concatenate([p[2][j][0] for p in parts])
            lengths = np.concatenate([p[2][j][1] for p in parts])
            ends = np.concatenate([[0], np.cumsum(lengths)])
            np.testing.assert_array_equal(np.diff(np.asarray(offsets)), lengths[start : start + n])
            np.testing.assert_array_equal(np.asarray(values, np.int64), flat[ends[start] : ends[start + n]])
        start += n
    assert start == len(frame)  # every row, none left out or added


def test_criteo_transform_remakes_the_dataset(tmp_path):
    out = tmp_path / "out"
    preprocess_criteo(
        [write(tmp_path / "train.tsv", TRAIN)], out, SMALL, test_files=[write(tmp_path / "test.tsv", TEST)]
    )
    rows = [line.split("\t") for line in TRAIN + TEST]
    names = ["label", "I1", "I2", "C1", "C2"]
    raw = pl.DataFrame({n: [r[i] or None for r in rows] for i, n in enumerate(names)})
    raw = raw.with_columns(pl.col("C1").str.to_uppercase())  # Criteo's values compare without case
    _check_remakes(out, raw.drop("label"), {"train": (0, 9), "test": (9, 13)})


def test_unseen_missing_and_bad_values():
    vocab = pl.DataFrame({"value": ["BR", "US", "rare"], "id": [2, 3, 1]})

    columns = [Column("country", "String", "categorical"), Column("age", "Int64", "categorical")]
    columns.append(Column("price", "Float64", "numerical"))
    categorical = [CategoricalInput("country", "country"), CategoricalInput("age", "age")]
    vocabularies = {"country": vocab, "age": pl.DataFrame({"value": ["30", "41"], "id": [2, 3]})}
    t = RowTransform("test", columns, [NumericalInput("price", "price")], categorical, [], vocabularies, ("NA",))
    numerical, categorical, bags = t.from_request(
        {
            "country": ["US", "FR", None, "NA", "rare"],
            "age": [b"41", "30", None, "x", "30"],
            "price": [1.5, None, 2, 3, 4],
        },
        5,
    )
    assert bags is None
    np.testing.assert_array_equal(categorical, [[3, 3], [0, 2], [0, 0], [0, 0], [1, 2]])
    np.testing.assert_array_equal(numerical[:, 0], [1.5, 0.0, 2.0, 3.0, 4.0])
    # the one column rule: a column left out refused, naming it, or (asked for) missing; an extra one ignored
    with pytest.raises(RowError, match="no column 'age', 'price'; the model reads country, age, price"):
        t.from_request({"country": ["BR"]}, 1)
    _, categorical, _ = t.from_request({"country": ["BR"], "clicked": [1]}, 1, missing_columns="missing")
    np.testing.assert_array_equal(categorical, [[2, 0]])
    with pytest.raises(RowError, match="none of the columns the model reads"):
        t.from_request({"clicked": [1]}, 1, missing_columns="missing")
    with pytest.raises(RowError, match="row 2: column 'price' holds 'abc'; expected a number"):
        t.from_request({"price": ["1", "abc"]}, 2, missing_columns="missing")
    with pytest.raises(RowError, match="column 'country' holds 2 values, expected 3"):
        t.from_request({"country": ["a", "b"]}, 3, missing_columns="missing")


def test_value_index_agrees_with_a_join_and_stored_forms_round_trip():
    rng = np.random.default_rng(0)
    values = pl.Series("value", [f"v{i}é" if i % 7 else f"a\0{i}" for i in range(5000)])
    vocab = pl.DataFrame({"value": values, "id": rng.permutation(5000).astype(np.int64) + 1})
    wanted = pl.Series([f"v{i}é" if i % 7 else f"a\0{i}" for i in rng.integers(0, 7000, 20000)] + [None, ""])
    index = ValueIndex(vocab)
    joined = wanted.alias("value").to_frame().join(vocab, on="value", how="left", maintain_order="left")
    want = joined["id"].fill_null(0).to_numpy()
    for lo, hi in ((0, 9000), (9000, len(wanted))):  # hash pairs searched (fewer than 2 x 5000), then joined
        assert index.by_join(hi - lo) == (hi - lo >= 10000)
        np.testing.assert_array_equal(index(wanted[lo:hi]), want[lo:hi])
    index.collides = True  # the path taken when two values share a hash
    np.testing.assert_array_equal(index(wanted), want)
    for text in (values, pl.Series(["", "x"]), pl.Series([], dtype=pl.String), pl.Series(["ab", "c"])):
        assert strings(*utf8(text)).to_list() == text.to_list()


def test_vocabularies_too_large_to_carry_leave_their_rare_values_out(tmp_path, monkeypatch):
    """Past ``MAX_CARRIED_VALUES`` the values rarer than the threshold are not carried: they score as unseen (0)
    where the dataset says rare (1); every other id is the dataset's."""
    from ctrkit.preprocess import transform as transform_module

    _table().write_csv(tmp_path / "clicks.csv")
    out = tmp_path / "ds"
    flags = ["--label", "click", "--categorical", "item", "--drop", "ts,genres", "--frequency-threshold", "20"]
    assert run_cli("preprocess", "table", tmp_path / "clicks.csv", "--out", out, "--no-progress", *flags)[0] == 0
    monkeypatch.setattr(transform_module, "MAX_CARRIED_VALUES", 10)
    carried = from_dataset(out)
    assert carried.rare_values == "missing"
    assert all((v["id"] >= 2).all() for v in carried.vocabularies.values())
    csv = pl.read_csv(tmp_path / "clicks.csv", infer_schema=False)
    spec = FeatureSpec.from_yaml(out)
    stored = np.stack(open_mapping(spec, "train").categorical, 1).astype(np.int64)
    _, categorical, _ = carried(carried.typed(csv[:540]))
    assert (stored == 1).any()
    np.testing.assert_array_equal(categorical, np.where(stored == 1, 0, stored))
    back = RowTransform.from_state(carried.to_state())
    assert back.rare_values == "missing"
