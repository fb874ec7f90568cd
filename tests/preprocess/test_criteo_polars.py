"""The Criteo recipe on Polars, on hand-written rows with known results and on the real sample."""

import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.split_binary import DataError
from ctrkit.preprocess.criteo import CriteoRecipe, numerical_transform
from ctrkit.preprocess.output import Rejects
from ctrkit.preprocess.polars_engine import _Parser, preprocess_criteo
from ctrkit.preprocess.vocabulary import key_strings
from tests.conftest import SHARED_DATA, run_cli

SMALL = CriteoRecipe(num_numerical=2, num_categorical=2, frequency_threshold=2)
TRAIN = [  # label, I1, I2, C1, C2
    "1\t5\t-1\taa\t0f",
    "0\t-3\t\taa\t0f",
    "0\t\t7\tbb\t0f",
    "1\t0\t-2\tcc\t",
    "0\t2\t2\tbb\t1e",
    "1\t1\t1\tcc\t1e",
    "0\t9\t3\taa\t1e",
    "0\t4\t4\tdd\t2d",
    "1\t3\t5\t\t2d",
]
TEST = ["1\t6\t0\tbb\tff", "0\t\t\tdd\t0f", "1\t1\t1\tee\t", "0\t2\t2\t\t2d"]


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_known_ids_and_values(tmp_path):
    summary = preprocess_criteo(
        [write(tmp_path / "train.tsv", TRAIN)], tmp_path / "out", SMALL, test_files=[write(tmp_path / "test.tsv", TEST)]
    )
    # C1 train counts: aa 3, bb 2, cc 2, dd 1 -> aa 2, bb 3, cc 4 (tie broken by value), dd rare 1, '' 0
    # C2 train counts: 0f 3, 1e 3, 2d 2 -> 0f 2, 1e 3 (tie by value), 2d 4; '' 0
    assert summary["cardinalities"] == {"C1": 5, "C2": 5}
    assert (summary["train_rows"], summary["test_rows"], summary["bad_rows"]) == (9, 4, 0)
    train = SplitBinaryDataset(tmp_path / "out", "train").slice(0, 9)
    np.testing.assert_array_equal(train.categorical[:, 0].numpy(), [2, 2, 3, 4, 3, 4, 2, 1, 0])
    np.testing.assert_array_equal(train.categorical[:, 1].numpy(), [2, 2, 2, 0, 3, 3, 3, 4, 4])
    np.testing.assert_array_equal(train.labels.numpy(), [1, 0, 0, 1, 0, 1, 0, 0, 1])
    # log(max(x, -2) + 3), missing -> 0: 5 -> log 8, -3 -> log 1 = 0, '' -> 0, 0 -> log 3, -1 -> log 2
    expected_i1 = np.log(np.array([5, -2, np.nan, 0, 2, 1, 9, 4, 3]) + 3)
    expected_i2 = np.log(np.array([-1, np.nan, 7, -2, 2, 1, 3, 4, 5]) + 3)
    expected = np.nan_to_num(np.stack([expected_i1, expected_i2], 1), nan=0.0).astype(np.float16)
    np.testing.assert_array_equal(train.numerical.numpy(), expected.astype(np.float32))
    test = SplitBinaryDataset(tmp_path / "out", "test").slice(0, 4)
    # bb -> 3; dd was rare in train -> 1; ee never seen -> 0; '' -> 0; ff unseen -> 0
    np.testing.assert_array_equal(test.categorical.numpy(), [[3, 0], [1, 2], [0, 0], [0, 4]])
    vocab = pl.read_parquet(tmp_path / "out" / "vocab" / "C1.parquet")
    assert vocab.rows() == [("aa", 3, 2), ("bb", 2, 3), ("cc", 2, 4), ("dd", 1, 1)]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["engine"] == "polars"


def test_ties_across_lengths_and_cases(tmp_path):
    # every C1 value twice ('a' and 'A' are one value); ties go to fewer digits, then the number: 8 and
    # more digits included (their keys pass 2**63), and the vocabulary spells each value back
    values = ["00000000a", "0000000a", "a", "A", "0000000a", "00000000a", "ffffffff", "ffffffff", "b", "b"]
    rows = [f"{i % 2}\t{i}\t1\t{v}\t0f" for i, v in enumerate(values)]
    recipe = CriteoRecipe(num_numerical=2, num_categorical=2, frequency_threshold=1)
    preprocess_criteo(
        [write(tmp_path / "t.tsv", rows)], tmp_path / "out", recipe, test_files=[write(tmp_path / "s.tsv", rows[:1])]
    )
    vocab = pl.read_parquet(tmp_path / "out" / "vocab" / "C1.parquet")
    assert vocab.rows() == [("a", 2, 2), ("b", 2, 3), ("0000000a", 2, 4), ("ffffffff", 2, 5), ("00000000a", 2, 6)]
    train = SplitBinaryDataset(tmp_path / "out", "train").slice(0, 10)
    np.testing.assert_array_equal(train.categorical[:, 0].numpy(), [6, 4, 2, 2, 4, 6, 5, 5, 3, 3])


def test_fast_and_checking_paths_give_the_same_keys():
    # blocks without a '+' take Polars' typed reader and an unsigned hex parse; others go line by line
    # through vocabulary.key_expr: a value must get one key either way, or its counts would split
    values = ["", "0", "a", "A", "0a", "ffffffff", "FFFFFFFF", "00000000a", "123456789abcdef", "7fffffffffffffff"[1:]]
    parser = _Parser(CriteoRecipe(num_numerical=1, num_categorical=1), Rejects("error"))
    block = "".join(f"1\t2\t{v}\n" for v in values).encode()
    fast = parser._keys(parser._fast(block, len(values)))[0]
    slow = parser._slow(block, Path("b.tsv"), 1)["C1"].to_numpy()
    np.testing.assert_array_equal(fast, slow)
    assert len(set(fast.tolist())) == len(values) - 2  # 'a'/'A' and 'ffffffff'/'FFFFFFFF' are one value each
    assert key_strings(fast).to_list() == [v.lower() for v in values]


def test_numerical_transform_table_and_beyond():
    ints = np.array([[-7, -3, -2, -1, 0, 1, 2], [65_533, 65_534, 65_535, 65_536, 65_537, 10**9, 2**62]])
    expected = np.log(np.maximum(ints, -2).astype(np.float64) + 3).astype(np.float16)
    np.testing.assert_array_equal(numerical_transform(ints), expected)
    many = np.random.default_rng(0).integers(-5, 200_000, size=(1000, 13))
    np.testing.assert_array_equal(numerical_transform(many), np.log(np.maximum(many, -2) + 3.0).astype(np.float16))


def test_gzip_input_gives_identical_files(tmp_path):
    plain = write(tmp_path / "day.tsv", TRAIN + TEST)
    with gzip.open(tmp_path / "day.tsv.gz", "wt") as f:
        f.write(plain.read_text())
    preprocess_criteo([plain], tmp_path / "a", SMALL, test_fraction=0.3)
    preprocess_criteo([tmp_path / "day.tsv.gz"], tmp_path / "b", SMALL, test_fraction=0.3)
    for path in sorted((tmp_path / "a").rglob("*.bin")):
        assert path.read_bytes() == (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes(), path
    assert len(SplitBinaryDataset(tmp_path / "a", "test")) == 4  # the last 30% of 13 rows


@pytest.mark.parametrize(
    "line, message",
    [
        ("1\t5\t2\taa", "expected 5 tab-separated fields, found 4"),
        ("2\t5\t2\taa\t0f", "label: expected a label of 0 or 1 \\(or 1.0/0.0, true/false\\), got '2'"),
        ("1\t5\tx\taa\t0f", "I2: 'x' is not an integer"),
        ("1\t5\t2\tzz\t0f", "C1: 'zz' is not a hexadecimal category \\(1 to 15 digits\\)"),
        ("1\t5\t2\t+a\t0f", "C1: '\\+a' is not a hexadecimal category"),
        ("1\t5\t2\taa\t0123456789abcdef", "C2: '0123456789abcdef' is not a hexadecimal category"),
    ],
)
def test_bad_rows_are_named_or_skipped(tmp_path, line, message):
    raw = write(tmp_path / "bad.tsv", TRAIN[:2] + [line] + TRAIN[2:])
    with pytest.raises(DataError, match=rf"bad.tsv:3: {message}"):
        preprocess_criteo([raw], tmp_path / "out", SMALL, test_fraction=0.3)
    assert not (tmp_path / "out").exists()  # nothing that looks like a dataset
    summary = preprocess_criteo([raw], tmp_path / "out", SMALL, test_fraction=0.3, bad_rows="skip")
    assert summary["bad_rows"] == 1 and summary["train_rows"] + summary["test_rows"] == 9
    reject = json.loads((tmp_path / "out" / "rejects.jsonl").read_text().splitlines()[0])
    assert reject["line_no"] == 3 and re.fullmatch(message + ".*", reject["problem"]) and reject["line"] == line


def test_input_and_output_errors(tmp_path, capsys):
    raw = write(tmp_path / "day.tsv", TRAIN)
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(ValueError, match="empty.tsv: input file is empty"):
        preprocess_criteo([tmp_path / "empty.tsv"], tmp_path / "o", SMALL, test_fraction=0.5)
    with pytest.raises(ValueError, match="missing.tsv: input file not found"):
        preprocess_criteo([tmp_path / "missing.tsv"], tmp_path / "o", SMALL, test_fraction=0.5)
    preprocess_criteo([raw], tmp_path / "o", SMALL, test_fraction=0.5)
    with pytest.raises(ValueError, match="not empty; set `overwrite`"):
        preprocess_criteo([raw], tmp_path / "o", SMALL, test_fraction=0.5)
    code, _, err = run_cli("preprocess", "criteo", tmp_path / "missing.tsv", "--out", tmp_path / "x", capsys=capsys)
    assert code == 2 and "input file not found" in err


REAL = SHARED_DATA / "criteo_kaggle" / "train_head_10k.txt"


@pytest.mark.skipif(not REAL.exists(), reason="real Criteo sample absent (../shared/data)")
def test_real_sample_preprocess_train_evaluate(tmp_path, capsys):
    raw = tmp_path / "train_head_10k.txt"
    shutil.copy(REAL, raw)  # read-only source; the copy lives in pytest's temp dir, never in the repo
    code, out, _ = run_cli(
        "preprocess", "criteo", raw, "--out", tmp_path / "ds", "--test-fraction", "0.2", capsys=capsys
    )
    assert code == 0 and "8,000 train + 2,000 test rows, 0 bad rows" in out
    code, out, _ = run_cli(
        "train",
        "--dataset",
        tmp_path / "ds",
        "--epochs",
        "3",
        "--no-progress",
        "--save-checkpoint",
        tmp_path / "m.pt",
        capsys=capsys,
    )
    assert code == 0
    code, out, _ = run_cli(
        "evaluate", "--checkpoint", tmp_path / "m.pt", "--dataset", tmp_path / "ds", "--json", capsys=capsys
    )
    assert json.loads(out)["auc"] > 0.65  # 0.709 measured; chance is 0.5
