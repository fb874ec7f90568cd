"""`ctrkit preprocess table`: a CSV or Parquet table with a header -> a dataset, checked against ids and
values computed here from the same rows, and a model trained on the result."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import polars as pl
import pytest

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.split_binary import open_mapping
from tests.conftest import run_cli

ROWS = 600


def _table(seed: int = 0) -> pl.DataFrame:
    """A click table as a user would have it: text ids, an integer id, a float amount, genres, a time."""
    rng = np.random.default_rng(seed)
    users = np.array([f"u{i}" for i in range(40)])
    user = users[np.minimum(rng.geometric(0.08, ROWS) - 1, 39)]
    item = rng.integers(0, 25, ROWS)
    price = np.round(rng.lognormal(2.0, 1.0, ROWS), 3)
    genres = ["|".join(sorted(set(rng.choice(["a", "b", "c", "d"], rng.integers(0, 3))))) for _ in range(ROWS)]
    logit = (item % 3 == 0) * 1.2 - 0.3 * np.log(price) + np.array([g.count("a") for g in genres])
    click = (rng.random(ROWS) < 1 / (1 + np.exp(-logit))).astype(int)
    return pl.DataFrame(
        {
            "ts": rng.permutation(ROWS),
            "user": user,
            "item": item,
            "price": price,
            "genres": genres,
            "device": rng.choice(["ios", "android", None], ROWS),
            "click": click,
        }
    )


def _expected_ids(train: list, values: list, threshold: int) -> np.ndarray:
    """The recipe's ids, computed independently: 2.. by descending train count (ties by text), 1 rare, 0 else."""
    counts = Counter(v for v in train if v is not None)
    kept = sorted((v for v in counts if counts[v] >= threshold), key=lambda v: (-counts[v], v))
    index = {v: i + 2 for i, v in enumerate(kept)}
    return np.array([0 if v is None else index.get(v, 1 if v in counts else 0) for v in values])


@pytest.fixture
def csv_file(tmp_path):
    path = tmp_path / "clicks.csv"
    _table().write_csv(path)
    return path


def test_ids_numbers_labels_and_split_match_an_independent_encoding(csv_file, tmp_path, capsys):
    out = tmp_path / "ds"
    code, stdout, _ = run_cli("preprocess", "table", csv_file, "--out", out, "--label", "click", "--categorical",
                              "item", "--multi-hot", "genres", "--drop", "ts", "--validation-fraction", "0.2",
                              "--frequency-threshold", "2", "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 0, stdout
    assert "432 train + 108 validation + 60 test rows" in stdout
    df = pl.read_csv(csv_file)
    spec = FeatureSpec.from_yaml(out)
    assert spec.onehot_features == ("item", "user", "device")  # named first, then text columns in table order
    assert spec.multi_hot_features == ("genres",) and spec.numerical_features == ("price",)
    bounds = {"train": (0, 432), "validation": (432, 540), "test": (540, 600)}
    for name in ("user", "item", "device"):
        values = [None if v is None else str(v) for v in df[name].to_list()]
        ids = _expected_ids(values[:432], values, 2)
        for mapping, (lo, hi) in bounds.items():
            got = open_mapping(spec, mapping).categorical[spec.onehot_features.index(name)]
            np.testing.assert_array_equal(np.asarray(got), ids[lo:hi], err_msg=f"{name} in {mapping}")
        vocab = pl.read_parquet(out / "vocab" / f"{name}.parquet")
        assert int(vocab["count"].sum()) == sum(v is not None for v in values[:432])
    bags = [[g for g in s.split("|") if g] for s in df["genres"].fill_null("").to_list()]
    flat_train = [g for b in bags[:432] for g in b]
    genre_ids = {g: int(_expected_ids(flat_train, [g], 2)[0]) for g in "abcd"}
    test = open_mapping(spec, "test")
    ids, offsets = test.multi_hot[0]
    for r in range(0, 60, 7):
        assert list(ids[offsets[r] : offsets[r + 1]]) == [genre_ids[g] for g in bags[540 + r]]
    np.testing.assert_array_equal(np.asarray(test.numerical)[:, 0], df["price"].to_numpy()[540:].astype("f4"))
    np.testing.assert_array_equal(np.asarray(test.labels), df["click"].to_numpy()[540:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["clicks"]["test"] == int(df["click"][540:].sum())


def test_parquet_with_a_list_column_gives_the_csv_dataset(csv_file, tmp_path):
    df = pl.read_csv(csv_file)
    parquet = tmp_path / "clicks.parquet"
    df.with_columns(
        pl.col("genres").fill_null("").str.split("|").list.eval(pl.element().filter(pl.element() != ""))
    ).write_parquet(parquet)
    flags = ["--label", "click", "--categorical", "item", "--drop", "ts", "--no-progress"]
    assert run_cli("preprocess", "table", csv_file, "--out", tmp_path / "a", "--multi-hot", "genres", *flags)[0] == 0
    assert run_cli("preprocess", "table", parquet, "--out", tmp_path / "b", *flags)[0] == 0  # the list: multi-hot
    for f in sorted((tmp_path / "a" / "test").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / "test" / f.name).read_bytes(), f.name


def test_order_shuffle_thresholds_and_test_files(csv_file, tmp_path):
    df = pl.read_csv(csv_file)
    base = ["--categorical", "item", "--multi-hot", "genres", "--no-progress"]
    # a rating turned into a click, rows in time order: the test split is the latest 10%
    assert run_cli("preprocess", "table", csv_file, "--out", tmp_path / "t", "--label", "price", "--label-threshold",
                   "8", "--order-by", "ts", "--drop", "click", *base)[0] == 0  # fmt: skip
    test = open_mapping(FeatureSpec.from_yaml(tmp_path / "t"), "test")
    latest = df.sort("ts")[540:]
    np.testing.assert_array_equal(np.asarray(test.labels), (latest["price"] >= 8).cast(pl.UInt8).to_numpy())
    # the label as "equals this value"
    assert run_cli("preprocess", "table", csv_file, "--out", tmp_path / "p", "--label", "user", "--positive", "u0",
                   "--drop", "click,ts", *base)[0] == 0  # fmt: skip
    labels = np.asarray(open_mapping(FeatureSpec.from_yaml(tmp_path / "p"), "train").labels)
    np.testing.assert_array_equal(labels, (df["user"][:540] == "u0").cast(pl.UInt8).to_numpy())
    # shuffling is a fixed function of the seed
    for name in ("s1", "s2"):
        assert run_cli("preprocess", "table", csv_file, "--out", tmp_path / name, "--label", "click", "--shuffle-seed",
                       "3", "--drop", "ts", *base)[0] == 0  # fmt: skip
    assert (tmp_path / "s1/test/label.bin").read_bytes() == (tmp_path / "s2/test/label.bin").read_bytes()
    assert (tmp_path / "s1/test/label.bin").read_bytes() != df["click"][540:].cast(pl.UInt8).to_numpy().tobytes()
    # test files: every row of the training file is train
    later = tmp_path / "later.csv"
    df[:50].write_csv(later)
    assert run_cli("preprocess", "table", csv_file, "--test-files", later, "--out", tmp_path / "f", "--label", "click",
                   "--drop", "ts", *base)[0] == 0  # fmt: skip
    spec = FeatureSpec.from_yaml(tmp_path / "f")
    assert len(SplitBinaryDataset(spec, "train")) == ROWS and len(SplitBinaryDataset(spec, "test")) == 50


@pytest.mark.parametrize(
    "edit, flags, expected",
    [
        (None, ["--categorical", "nope"], "--categorical: {csv} has no column 'nope' (columns: ts, user"),
        (None, [], "{csv}: columns 'ts', 'item' hold integers; name each in --categorical"),
        (("click", 5, "2"), ["--categorical", "item", "--drop", "ts"], "{csv}:7: click: expected a label of 0 or 1 "
         "(or 1.0/0.0, true/false), got '2'"),
        (("price", 9, "cheap"), ["--categorical", "item", "--drop", "ts", "--numerical", "price"],
         "{csv}:11: column 'price' holds 'cheap'; expected a number"),
        (("price", 9, "cheap"), ["--categorical", "item", "--drop", "ts"], "{csv}:11: column 'price' holds text, but "
         "599 of its 600 values are numbers (here 'cheap'): name it in --numerical"),
        (None, ["--categorical", "item", "--numerical", "item"], "column 'item' is given two roles"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_naming_file_line_and_field(csv_file, tmp_path, capsys, edit, flags, expected):
    if edit is not None:
        column, row, value = edit
        df = pl.read_csv(csv_file, infer_schema_length=0)
        df = df.with_columns(pl.when(pl.int_range(pl.len()) == row).then(pl.lit(value)).otherwise(pl.col(column))
                             .alias(column))  # fmt: skip
        df.write_csv(csv_file)
    code, _, err = run_cli("preprocess", "table", csv_file, "--out", tmp_path / "d", "--label", "click",
                           "--multi-hot", "genres", "--no-progress", *flags, capsys=capsys)  # fmt: skip
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert expected.format(csv=csv_file) in err
    assert not (tmp_path / "d").exists()


def test_bad_rows_can_be_skipped_and_counted(csv_file, tmp_path, capsys):
    df = pl.read_csv(csv_file, infer_schema_length=0)
    df = df.with_columns(pl.when(pl.int_range(pl.len()).is_in([3, 4])).then(pl.lit("x")).otherwise(pl.col("click"))
                         .alias("click"))  # fmt: skip
    df.write_csv(csv_file)
    code, stdout, _ = run_cli("preprocess", "table", csv_file, "--out", tmp_path / "d", "--label", "click",
                              "--categorical", "item", "--multi-hot", "genres", "--drop", "ts", "--bad-rows", "skip",
                              "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 0 and "2 bad rows dropped" in stdout
    rejects = [json.loads(line) for line in (tmp_path / "d" / "rejects.jsonl").read_text().splitlines()]
    assert [r["line_no"] for r in rejects] == [5, 6]


def test_a_model_trains_and_evaluates_on_the_result(csv_file, tmp_path, capsys):
    out = tmp_path / "ds"
    assert run_cli("preprocess", "table", csv_file, "--out", out, "--label", "click", "--categorical", "item",
                   "--multi-hot", "genres", "--drop", "ts", "--no-progress")[0] == 0  # fmt: skip
    ckpt = tmp_path / "m.pt"
    code, stdout, _ = run_cli("train", "--dataset", out, "--model", "dcnv2", "--epochs", "2", "--batch-size", "64",
                              "--no-progress", "--save-checkpoint", ckpt, capsys=capsys)  # fmt: skip
    assert code == 0, stdout
    code, stdout, _ = run_cli("evaluate", "--checkpoint", ckpt, "--dataset", out, "--json", capsys=capsys)
    assert code == 0
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["samples"] == 60 and 0.0 <= result["auc"] <= 1.0


def test_also_categorical_gives_each_repeated_number_its_own_id(tmp_path):
    amounts = [5.0, 2.5, 5.0, 7.0, 2.5, 5.0, 9.25, 2.5, 5.0, 7.0, 1.0, 5.0]  # train (9 rows): 5 x4, 2.5 x3, 7, 9.25
    path = tmp_path / "t.csv"
    pl.DataFrame({"shop": ["a", "b"] * 6, "amount": amounts, "click": [0, 1] * 6}).write_csv(path)
    out = tmp_path / "d"
    assert run_cli("preprocess", "table", path, "--out", out, "--label", "click", "--numerical", "amount",
                   "--also-categorical", "amount", "--frequency-threshold", "2", "--test-fraction", "0.25",
                   "--no-progress")[0] == 0  # fmt: skip
    spec = FeatureSpec.from_yaml(out)
    assert spec.onehot_features == ("shop", "amount_id") and spec.numerical_features == ("amount",)
    train = open_mapping(spec, "train")
    ids = np.asarray(train.categorical[1])
    by_value = {}
    for value, i in zip(amounts[:9], ids):
        by_value.setdefault(value, set()).add(int(i))
    assert by_value == {5.0: {2}, 2.5: {3}, 7.0: {1}, 9.25: {1}}  # by count; seen once: the rare id
    np.testing.assert_array_equal(np.asarray(train.numerical)[:, 0], np.array(amounts[:9], dtype="f4"))
    test_ids = np.asarray(open_mapping(spec, "test").categorical[1])  # 7, 1, 5: rare, unseen, frequent
    np.testing.assert_array_equal(test_ids, [1, 0, 2])
    code = run_cli("preprocess", "table", path, "--out", tmp_path / "e", "--label", "click", "--also-categorical",
                   "shop", "--no-progress")[0]  # fmt: skip
    assert code == 2


def test_group_column_is_the_map_channel_of_evaluation_mappings(tmp_path, capsys):
    rng = np.random.default_rng(4)
    n = 900
    display = np.repeat([f"d{i}" for i in range(150)], 6)  # 150 displays of 6 ads, one click each
    ad = rng.integers(0, 30, n)
    click = np.zeros(n, dtype=int)
    click[np.arange(150) * 6 + rng.integers(0, 6, 150)] = 1
    path = tmp_path / "displays.csv"
    pl.DataFrame({"display": display, "ad": ad, "click": click}).write_csv(path)
    out = tmp_path / "ds"
    assert run_cli("preprocess", "table", path, "--out", out, "--label", "click", "--categorical", "ad", "--group",
                   "display", "--validation-fraction", "0.1", "--test-fraction", "0.2",
                   "--no-progress")[0] == 0  # fmt: skip
    spec = FeatureSpec.from_yaml(out)
    assert spec.group_feature == "display" and "display" not in spec.categorical_features
    assert open_mapping(spec, "train").groups is None
    groups = np.asarray(open_mapping(spec, "test").groups)
    names = display[720:]
    same = names[:, None] == names[None, :]  # rows share a group exactly when they share a display
    np.testing.assert_array_equal(groups[:, None] == groups[None, :], same)
    ckpt = tmp_path / "m.pt"
    assert run_cli("train", "--dataset", out, "--model", "wide_deep", "--max-steps", "5", "--batch-size", "64",
                   "--no-progress", "--save-checkpoint", ckpt)[0] == 0  # fmt: skip
    capsys.readouterr()
    code, stdout, _ = run_cli("evaluate", "--checkpoint", ckpt, "--dataset", out, "--json", capsys=capsys)
    result = json.loads(stdout.strip().splitlines()[-1])
    assert code == 0 and result["map_groups"] == 30 and 1 / 6 <= result["map@12"] <= 1.0


@pytest.mark.parametrize("role", ["categorical", "numerical"])
def test_integers_flag_gives_every_unnamed_integer_column_one_role(csv_file, tmp_path, role):
    out = tmp_path / role
    assert run_cli("preprocess", "table", csv_file, "--out", out, "--label", "click", "--multi-hot", "genres",
                   "--integers", role, "--no-progress")[0] == 0  # fmt: skip
    spec = FeatureSpec.from_yaml(out)
    if role == "categorical":
        assert spec.onehot_features == ("user", "device", "ts", "item") and spec.numerical_features == ("price",)
    else:
        assert spec.onehot_features == ("user", "device") and spec.numerical_features == ("price", "ts", "item")


def test_tab_separated_input_as_a_shell_spells_the_tab(csv_file, tmp_path, capsys):
    tsv = tmp_path / "clicks.tsv"
    pl.read_csv(csv_file).write_csv(tsv, separator="\t")
    flags = ["--label", "click", "--categorical", "item", "--multi-hot", "genres", "--drop", "ts", "--no-progress"]
    assert run_cli("preprocess", "table", csv_file, "--out", tmp_path / "c", *flags)[0] == 0
    assert run_cli("preprocess", "table", tsv, "--out", tmp_path / "t", "--csv-separator", "\\t", *flags)[0] == 0
    for f in sorted((tmp_path / "c" / "train").iterdir()):
        assert f.read_bytes() == (tmp_path / "t" / "train" / f.name).read_bytes(), f.name
    code, _, err = run_cli("preprocess", "table", tsv, "--out", tmp_path / "x", "--csv-separator", "::", *flags,
                           capsys=capsys)  # fmt: skip
    assert code == 2 and "--csv-separator must be one byte" in err


def test_raw_id_columns_hold_the_xxh64_of_their_text(csv_file, tmp_path, capsys):
    import xxhash

    out = tmp_path / "raw"
    code, stdout, _ = run_cli("preprocess", "table", csv_file, "--out", out, "--label", "click", "--categorical",
                              "item", "--multi-hot", "genres", "--drop", "ts", "--raw-ids", "user,item", "--capacity",
                              "30", "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 0, stdout
    spec = FeatureSpec.from_yaml(out)
    assert spec.dynamic_features == ("item", "user") and spec.feature_spec["user"].cardinality == 30
    assert spec.feature_spec["device"].cardinality < 30 and not spec.feature_spec["device"].dynamic
    df = pl.read_csv(csv_file)
    train = open_mapping(spec, "train")
    for name in ("user", "item"):
        want = [0 if v is None else xxhash.xxh64_intdigest(str(v).encode()) for v in df[name].to_list()[:540]]
        got = np.asarray(train.categorical[spec.onehot_features.index(name)])
        np.testing.assert_array_equal(got.view(np.uint64), np.array(want, np.uint64))
    code, _, err = run_cli("preprocess", "table", csv_file, "--out", tmp_path / "bad", "--label", "click",
                           "--categorical", "item", "--drop", "ts,genres", "--raw-ids", "price", "--no-progress",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and "'price' is not a categorical column" in err


def test_roles_are_printed_and_traps_refused_early(csv_file, tmp_path, capsys):
    out = tmp_path / "ds"
    flags = ["--label", "click", "--categorical", "item", "--order-by", "ts", "--drop", "genres", "--no-progress"]
    code, stdout, _ = run_cli("preprocess", "table", csv_file, "--out", out, *flags, capsys=capsys)
    assert code == 0
    assert "columns: label click; order ts; categorical item, user, device; numerical price; dropped genres" in stdout
    # an existing --out is refused before the work: here before the input is even read
    code, _, err = run_cli("preprocess", "table", tmp_path / "missing.csv", "--out", out, "--label", "click",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and "directory exists and is not empty" in err
    # a text column of distinct values (a time as text) is not made a feature without a word
    rows = pl.DataFrame({"when": [f"2026-11-28T{i // 60:02d}:{i % 60:02d}.{i}" for i in range(1200)],
                         "ad": [f"a{i % 7}" for i in range(1200)], "click": [i % 2 for i in range(1200)]})  # fmt: skip
    rows.write_csv(tmp_path / "t.csv")
    code, _, err = run_cli("preprocess", "table", tmp_path / "t.csv", "--out", tmp_path / "t", "--label", "click",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and "column 'when' holds 1,200 distinct values in 1,200 rows" in err and "--order-by" in err
    assert run_cli("preprocess", "table", tmp_path / "t.csv", "--out", tmp_path / "t", "--label", "click",
                   "--order-by", "when", "--no-progress")[0] == 0  # fmt: skip
