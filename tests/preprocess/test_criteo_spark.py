"""The Spark engine against the Polars engine: byte-identical datasets on the same input.

A real local Spark session runs (Java 17 is on the machine; PySpark comes with ``ctrkit[spark]``).
"""

import gzip
import json
import re

import numpy as np
import pytest

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.split_binary import DataError
from ctrkit.data.synthetic import write_criteo_tsv
from ctrkit.preprocess.criteo import CriteoRecipe
from ctrkit.preprocess.polars_engine import preprocess_criteo
from tests.preprocess.test_criteo_polars import SMALL, TEST, TRAIN, write

pytest.importorskip("pyspark")
from ctrkit.preprocess.spark_engine import preprocess_criteo_spark  # noqa: E402

MASTER = "local[2]"
TIMING = ("engine", "seconds")  # the only summary fields allowed to differ


def assert_same_output(a, b):
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        if rel.name == "summary.json":
            sa, sb = (json.loads((d / rel).read_text()) for d in (a, b))
            assert {k: v for k, v in sa.items() if k not in TIMING} == {k: v for k, v in sb.items() if k not in TIMING}
        else:
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    return files_a


def test_engines_write_identical_files_with_bad_rows_and_gzip(tmp_path):
    raw = write_criteo_tsv(
        tmp_path / "day.tsv", 3000, cardinalities=[5, 40, 300, 2000] * 6 + [7, 11], seed=3, progress=False
    )
    lines = raw.read_text().splitlines()
    lines[10] = lines[10].replace("\t", "\tx", 1)  # label 'x...'
    lines[500] = "\t".join(lines[500].split("\t")[:-1])  # a field short
    lines[2999] = lines[2999] + "\tzz"  # a field too many
    meant = {}
    for k, (one, zero) in zip(range(20, 24), [("true", "false"), ("1.0", "0.0"), ("TRUE", "FALSE"), ("1", "0")]):
        label, rest = lines[k].split("\t", 1)  # the one label rule's spellings, on both engines
        meant[k] = int(label)
        lines[k] = f"{one if label == '1' else zero}\t{rest}"
    with gzip.open(tmp_path / "day2.tsv.gz", "wt") as f:
        f.write("\n".join(lines[:1500]) + "\n")
    (tmp_path / "day3.tsv").write_text("\n".join(lines[1500:]))  # no trailing newline
    inputs = [tmp_path / "day2.tsv.gz", tmp_path / "day3.tsv"]
    # C1 and C4 kept as raw ids (dynamic tables): each value's key, the same on both engines
    recipe = CriteoRecipe(frequency_threshold=2, raw_ids=("C1", "C4"), capacity=500)
    kw = dict(recipe=recipe, test_fraction=0.15, bad_rows="skip")
    polars = preprocess_criteo(inputs, tmp_path / "polars", **kw)
    spark = preprocess_criteo_spark(inputs, tmp_path / "spark", master=MASTER, **kw)
    assert polars["bad_rows"] == spark["bad_rows"] == 3
    files = assert_same_output(tmp_path / "polars", tmp_path / "spark")
    spec = FeatureSpec.from_yaml(tmp_path / "spark")
    assert spec.dynamic_features == ("cat_0.bin", "cat_3.bin") and spec.cardinalities[3] == 500
    good = [line for k, line in enumerate(lines) if k not in (10, 500, 2999)]
    values = [line.split("\t")[14 + 3] for line in good]  # C4 as written, in row order
    ids = SplitBinaryDataset(spec, "train").slice(0, 100).categorical[:, 3].numpy()
    expected = [0 if v == "" else (int(v, 16) + (len(v) << 60) + 2**63) % 2**64 - 2**63 for v in values[:100]]
    assert np.array_equal(ids, np.array(expected, np.int64)) and spec.cardinalities[1] < 500
    labels = SplitBinaryDataset(spec, "train").slice(19, 23).labels.numpy()  # lines 20-23, after the bad line 10
    assert labels.tolist() == [meant[k] for k in range(20, 24)]
    assert (
        len([f for f in files if f.suffix == ".bin"]) == 2 * (26 + 2)
        and (tmp_path / "spark" / "rejects.jsonl").exists()
    )


def test_spark_known_ids_with_test_files_and_errors(tmp_path):
    train, test = write(tmp_path / "train.tsv", TRAIN), write(tmp_path / "test.tsv", TEST)
    preprocess_criteo([train], tmp_path / "polars", SMALL, test_files=[test])
    summary = preprocess_criteo_spark([train], tmp_path / "spark", SMALL, test_files=[test], master=MASTER)
    assert summary["cardinalities"] == {"C1": 5, "C2": 5} and summary["engine"] == "spark"
    assert_same_output(tmp_path / "polars", tmp_path / "spark")  # the Polars test checks every id and value
    bad = write(tmp_path / "bad.tsv", TRAIN[:4] + ["1\t5\tx\taa\t0f"] + TRAIN[4:])
    with pytest.raises(DataError, match=r"bad.tsv:5: I2: 'x' is not an integer"):
        preprocess_criteo_spark([bad], tmp_path / "out", SMALL, test_fraction=0.3, master=MASTER)
    assert not (tmp_path / "out").exists()


def test_validation_mapping_is_the_tail_of_train_on_both_engines(tmp_path):
    from ctrkit.data.dataset import SplitBinaryDataset

    raw = write_criteo_tsv(tmp_path / "day.tsv", 2000, cardinalities=[5, 40, 300] * 8 + [7, 11], seed=4, progress=False)
    kw = dict(recipe=CriteoRecipe(frequency_threshold=2), test_fraction=0.1, progress=False)
    plain = preprocess_criteo([raw], tmp_path / "plain", **kw)
    polars = preprocess_criteo([raw], tmp_path / "polars", validation_fraction=0.25, **kw)
    spark = preprocess_criteo_spark([raw], tmp_path / "spark", master=MASTER, validation_fraction=0.25, **kw)
    assert_same_output(tmp_path / "polars", tmp_path / "spark")
    assert (polars["train_rows"], polars["validation_rows"], polars["test_rows"]) == (1350, 450, 200)
    assert spark["validation_rows"] == 450 and plain["train_rows"] == 1800
    whole = SplitBinaryDataset(tmp_path / "plain", "train").labels()
    validation = SplitBinaryDataset(tmp_path / "polars", "validation")
    assert (validation.labels() == whole[1350:]).all()  # the most recent train rows, in order
    # ids come from the vocabulary of the 1,350 train rows only: each is known there or 0/1
    train_ids = SplitBinaryDataset(tmp_path / "polars", "train").slice(0, 1350).categorical
    for f in range(train_ids.shape[1]):
        seen = set(train_ids[:, f].tolist()) | {0, 1}
        assert set(validation.slice(0, 450).categorical[:, f].tolist()) <= seen


@pytest.mark.parametrize("how, said", [
    ("lone CR", "day.tsv:1: lines end in a lone carriage return"),
    ("UTF-16", "day.tsv:1: the file is UTF-16 (it starts with a UTF-16 byte-order mark)"),
])  # fmt: skip
def test_a_day_file_that_is_not_text_by_the_readers_rules_is_refused_by_both_engines(tmp_path, how, said):
    """The first record of a day file is read by the table reader's rules on either engine: Spark, which splits lines
    at a lone carriage return too, no longer takes a file that Polars refuses."""
    text = "\n".join(TRAIN) + "\n"
    day = tmp_path / "day.tsv"
    day.write_bytes(text.replace("\n", "\r").encode() if how == "lone CR" else text.encode("utf-16"))
    for name, run in (("polars", lambda out: preprocess_criteo([day], out, SMALL, test_fraction=0.3)),
                      ("spark", lambda out: preprocess_criteo_spark([day], out, SMALL, test_fraction=0.3,
                                                                    master=MASTER))):  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(said)):
            run(tmp_path / name)
        assert not (tmp_path / name).exists()
