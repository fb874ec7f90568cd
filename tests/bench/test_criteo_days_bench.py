"""benchmarks/criteo_days.py on a tiny generated log: both ways score every later day; a vocabulary fixed on day 0
never grows its tables, one extended each day does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("criteo_days", None)
    import criteo_days

    return criteo_days


def test_each_way_scores_every_later_day_and_only_like_grows_the_tables(bench, tmp_path):
    out = tmp_path / "r.json"
    assert bench.main(["--days", "3", "--rows", "2500", "--steps", "4", "--no-real", "--work", str(tmp_path / "w"),
                       "--output", str(out)]) == 0  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["machine"]["cores"] and doc["commit"]
    (log,) = doc["logs"]
    like, fixed = log["ways"]["like"], log["ways"]["fixed"]
    assert [r["day"] for r in like["per_day"]] == [1, 2] == [r["day"] for r in fixed["per_day"]]
    assert all(r["rows"] == 2500 and 0.0 < r["auc"] < 1.0 for r in like["per_day"] + fixed["per_day"])
    # both score day 1 with the day-0 model: the same scores
    assert like["per_day"][0]["auc"] == fixed["per_day"][0]["auc"]
    day0 = sum(json.loads((tmp_path / "w" / "generated" / "d0" / "summary.json").read_text())["cardinalities"].values())
    assert [r["table_rows"] for r in fixed["per_day"]] == [day0, day0]
    assert day0 < like["per_day"][0]["table_rows"] < like["per_day"][1]["table_rows"]
    assert log["like_minus_fixed_auc"] == pytest.approx(like["mean_auc"] - fixed["mean_auc"])
