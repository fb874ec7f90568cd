"""A timestamp column in `preprocess table` (``preprocess/time_parts.py``): read as parts of time, each a categorical
feature whose ids are checked against the hour and day Python's datetime gives; found by itself (the --order-by column
too); refused, or skipped, where a value is no timestamp; and derived from the raw timestamp by `predict --input` and
the server (the carried transform) as in the dataset."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import polars as pl
import pytest

from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.split_binary import open_mapping
from ctrkit.preprocess.transform import from_dataset
from tests.conftest import run_cli
from tests.preprocess.test_transform import _timed_table


def _features(out) -> dict[str, np.ndarray]:
    """Every categorical feature of the dataset's train and test rows, in row order."""
    spec = FeatureSpec.from_yaml(out)
    names = spec.summary()["categorical_features"]
    parts = [open_mapping(spec, m) for m in ("train", "test")]
    return {n: np.concatenate([np.asarray(p.categorical[j], np.int64) for p in parts]) for j, n in enumerate(names)}


def _written_hour(text: str | None, part: str) -> str | None:
    """The part of a timestamp as its writer's clock says, by Python's datetime (the offset left out)."""
    if text is None:
        return None
    stamp = dt.datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")
    return str({"hour": stamp.hour, "weekday": stamp.isoweekday(), "month": stamp.month}[part])


def test_a_timestamp_becomes_hour_and_weekday_ids_as_datetime_reads_them(tmp_path, capsys):
    frame = _timed_table()
    frame.write_csv(tmp_path / "log.csv")
    out = tmp_path / "ds"
    code, stdout, _ = run_cli("preprocess", "table", tmp_path / "log.csv", "--out", out, "--label", "click",
                              "--order-by", "ts", "--time-parts", "hour,weekday,month", "--no-progress",
                              capsys=capsys)  # fmt: skip
    assert code == 0, stdout
    assert "time ts (hour, weekday, month)" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["time"] == {"ts": {"format": "%Y-%m-%dT%H:%M:%S%.f", "parts": ["hour", "weekday", "month"]}}
    features = _features(out)
    assert list(features) == ["shop", "ts_hour", "ts_weekday", "ts_month"]
    ordered = frame.sort("ts", nulls_last=True, maintain_order=True)  # --order-by: stable, missing last
    vocab = from_dataset(out).vocabularies
    for part in ("hour", "weekday", "month"):
        text_of = dict(zip(vocab[f"ts_{part}"]["id"].to_list(), vocab[f"ts_{part}"]["value"].to_list()))
        got = [text_of.get(int(i)) for i in features[f"ts_{part}"]]  # id 0: missing
        assert got == [_written_hour(t, part) for t in ordered["ts"].to_list()], part
    assert len(set(features["ts_hour"].tolist())) > 20  # every hour of the day, not one id for all


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], "log.csv:5: column 'ts' holds 'yesterday'; expected a timestamp of the column's format "
             "'%Y-%m-%dT%H:%M:%S%.f'"),
        (["--time", "shop"], "--time: {csv}: column 'shop' is not a timestamp: its first value 's"),
        (["--time", "price"], "column 'price' is not a timestamp"),
        (["--time-parts", "hour,second"], "--time-parts: expected distinct parts of hour, weekday"),
        (["--time-format", "iso"], "--time-format: expected a strftime pattern"),
        (["--time", "ts,auto"], "--time: 'auto' stands alone"),
    ],
)  # fmt: skip
def test_what_is_no_timestamp_is_refused_in_one_line(tmp_path, capsys, flags, expected):
    frame = _timed_table().with_columns(
        pl.when(pl.int_range(pl.len()) == 3).then(pl.lit("yesterday")).otherwise(pl.col("ts")).alias("ts")
    )
    csv = tmp_path / "log.csv"
    frame.write_csv(csv)
    code, _, err = run_cli("preprocess", "table", csv, "--out", tmp_path / "d", "--label", "click", "--no-progress",
                           *flags, capsys=capsys)  # fmt: skip
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert expected.format(csv=csv) in err
    assert not (tmp_path / "d").exists()


def test_bad_timestamps_can_be_skipped_and_no_time_read_at_all(tmp_path, capsys):
    frame = _timed_table().with_columns(
        pl.when(pl.int_range(pl.len()).is_in([3, 7])).then(pl.lit("soon")).otherwise(pl.col("ts")).alias("ts")
    )
    frame.write_csv(tmp_path / "log.csv")
    code, stdout, _ = run_cli("preprocess", "table", tmp_path / "log.csv", "--out", tmp_path / "d", "--label", "click",
                              "--bad-rows", "skip", "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 0 and "2 bad rows dropped" in stdout
    assert [json.loads(r)["line_no"] for r in (tmp_path / "d" / "rejects.jsonl").read_text().splitlines()] == [5, 9]
    code, stdout, _ = run_cli("preprocess", "table", tmp_path / "log.csv", "--out", tmp_path / "e", "--label", "click",
                              "--order-by", "ts", "--time", "none", "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 0
    assert json.loads((tmp_path / "e" / "summary.json").read_text())["categorical"] == ["shop"]


def test_predict_derives_the_parts_from_the_raw_timestamp_as_the_dataset_holds_them(tmp_path, capsys):
    """A model of a table with a timestamp scores its raw rows (`predict --input`) as `evaluate` scores the dataset;
    a row whose hour differs is scored differently (the part is read, not left missing)."""
    frame = _timed_table(rows=1200)
    hour = frame["ts"].str.slice(11, 2).cast(pl.Int64, strict=False)
    frame = frame.with_columns(click=((hour >= 18) | (pl.col("click") == 1) & (hour < 6)).fill_null(False).cast(int))
    frame.write_csv(tmp_path / "log.csv")
    out, ckpt = tmp_path / "ds", tmp_path / "m.pt"
    assert run_cli("preprocess", "table", tmp_path / "log.csv", "--out", out, "--label", "click", "--order-by", "ts",
                   "--test-fraction", "0.5", "--no-progress")[0] == 0  # fmt: skip
    code, stdout, _ = run_cli("train", "--dataset", out, "--model", "dlrm", "--epochs", "2", "--batch-size", "64",
                              "--no-progress", "--save-checkpoint", ckpt, capsys=capsys)  # fmt: skip
    assert code == 0, stdout
    test = frame.sort("ts", nulls_last=True, maintain_order=True)[600:]
    test.write_csv(tmp_path / "test.csv")
    code, _, err = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "test.csv", "--out",
                           tmp_path / "scores.csv", capsys=capsys)  # fmt: skip
    assert code == 0, err
    scores = pl.read_csv(tmp_path / "scores.csv")
    code, stdout, _ = run_cli("evaluate", "--checkpoint", ckpt, "--dataset", out, "--json", capsys=capsys)
    result = json.loads(stdout.strip().splitlines()[-1])
    from ctrkit.metrics import roc_auc

    column = [c for c in scores.columns if c not in test.columns][0]
    assert roc_auc(test["click"].to_numpy(), scores[column].to_numpy()) == pytest.approx(result["auc"], abs=1e-6)
    assert result["auc"] > 0.8  # the evening is learned: the hour is read
