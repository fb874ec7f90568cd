"""`ctrkit bench table-stream` on a small drifting table of text columns, five days: the `--like` stream keeps every
value's id from day to day while its tables grow, and each method's model scores every next day's raw rows."""

from __future__ import annotations

import json

import polars as pl

from tests.conftest import run_cli


def test_five_days_of_text_columns_keep_their_ids_and_score_each_next_day(tmp_path):
    out = tmp_path / "result.json"
    code = run_cli("bench", "table-stream", "--days", 5, "--rows", 2000, "--vocabularies", "40,300,8,900",
                   "--max-steps", 30, "--methods", "like,raw_ids,retrain,regression", "--work", tmp_path / "work",
                   "--output", out)[0]  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert [r["test_day"] for r in result["days"]] == [2, 3, 4, 5]
    for method in ("like", "raw_ids", "retrain", "regression"):  # every next day scored; better than chance
        aucs = [record[method]["auc"] for record in result["days"]]
        assert all(0.0 < a < 1.0 for a in aucs) and result["summary"][method]["mean_auc"] > 0.52, (method, aucs)
    runs = tmp_path / "work" / "runs"
    rows = []
    for k in range(1, 4):  # every value with a row of its own on day k keeps its id on day k + 1
        for column in ("cat0", "cat1", "cat3"):
            old = pl.read_parquet(runs / f"like_{k}" / "vocab" / f"{column}.parquet").select("value", "id")
            old = old.filter(pl.col("id") >= 2)
            new = pl.read_parquet(runs / f"like_{k + 1}" / "vocab" / f"{column}.parquet").select("value", "id")
            joined = old.join(new, on="value", how="left", suffix="_next")
            assert joined["id_next"].null_count() == 0 and (joined["id"] == joined["id_next"]).all(), (k, column)
        rows.append(result["days"][k - 1]["like"]["table_rows"])
    assert rows == sorted(rows) and rows[-1] > rows[0]  # the tables grew for the new ads
    summary = result["summary"]
    assert set(summary) == {"like", "raw_ids", "retrain", "regression"}
    assert all(s["train_seconds"] > 0 for s in summary.values())
    # the regression reads the retrained model's preprocessing (days 1..k fitted together): the same tables
    assert [d["regression"]["table_rows"] for d in result["days"]] == [
        d["retrain"]["table_rows"] for d in result["days"]
    ]
    # and it is reproduced from the dataset and the next day's file alone
    from ctrkit.bench.table_stream import _regression

    again = _regression(runs / "all_4", tmp_path / "work" / "days" / "day_5.csv")
    assert again == {k: result["days"][-1]["regression"][k] for k in ("auc", "logloss")}
