"""`ctrkit bench raw-rows` on a tiny log: predict --input timed at two file sizes (its scores are what predict writes),
one-row requests of both kinds answered, and the result condensed into the suite's table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

from tests.conftest import free_port, run_cli

ROOT = Path(__file__).resolve().parents[2]


def test_bench_raw_rows_times_predict_and_requests(tmp_path):
    out = tmp_path / "raw_rows.json"
    args = ["--rows", 600, "--rounds", 1, "--requests", 8, "--port", free_port(), "--train-rows", 3000, "--steps", 5,
            "--warm-up-seconds", 0.5, "--work", tmp_path / "work", "--output", out]  # fmt: skip
    assert run_cli("bench", "raw-rows", *args)[0] == 0
    result = json.loads(out.read_text())
    medians = result["predict_median"]
    assert {m["rows"] for m in medians.values()} == {600, 1200}
    assert all(m["rows_per_s"] > 0 and m["peak_rss_mib"] > 50 for m in medians.values())
    scores = pl.read_csv(tmp_path / "work" / "scores_new.csv")
    assert scores.columns == ["ts", "probability"] and len(scores) == 600
    assert scores["probability"].is_between(0, 1).all()
    for kind in ("raw", "ids"):
        m = result["requests"][kind]
        assert m["requests"] == 8 and 0 < m["p50_ms"] <= m["p99_ms"]
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the condensing step every suite goes through
    try:
        import collect
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    columns, rows = collect.SUITES["raw-rows"]([("raw_rows", result)])
    assert [r[1] for r in rows[:2]] == [1200, 600] and len(columns) == len(rows[0])
    assert {r[0] for r in rows[2:]} == {"one-row request (raw)", "one-row request (ids)"}
