"""``ctrkit bench refresh`` end to end on small shop logs: every day refreshed, the renamed and emptied days refused,
the clean days beside retraining, a logistic regression and the steps by hand, the counts read off the days, and the
suite's result file collected from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]


def test_bench_refresh_counts_its_days_and_collects(tmp_path, capsys):
    out = tmp_path / "refresh.json"
    code, text, _ = run_cli("bench", "refresh", "--family", "shop", "--days", "6", "--rows", "800", "--clean-seeds",
                            "0", "--max-steps", "10", "--no-swaps", "--work", tmp_path / "work", "--output", out,
                            capsys=capsys)  # fmt: skip
    assert code == 0 and "clean days: 6" in text
    result = json.loads(out.read_text())
    clean, broken = result["streams"]["clean-0"], result["streams"]["broken-2"]
    assert [d["day"] for d in clean] == list(range(1, 7)) and [d["day"] for d in broken] == list(range(1, 7))
    assert broken[4]["verdict"] == "refused" and "lacks category" in broken[4]["reason"]  # day 5: renamed
    assert broken[5]["verdict"] == "refused" and "missing share of price" in broken[5]["reason"]  # day 6: emptied
    s = result["summary"]
    assert s["false_refusals"] == sum(d["verdict"] == "refused" for d in clean)
    assert s["broken_refused"] == sum(d["verdict"] == "refused" for d in broken[3:6]) >= 2
    later = clean[1:]
    assert all(0.4 < d["retrain_auc"] < 1 and 0.4 < d["logistic_auc"] < 1 and d["hand_seconds"] > 0 for d in later)
    assert s["mean_logistic_auc"] == round(sum(d["logistic_auc"] for d in later) / len(later), 5)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import collect
    finally:
        sys.path.pop(0)
    written = json.loads(collect.collect("refresh", out, kind="cpu-test", command="test",
                                         results=tmp_path / "results").read_text())  # fmt: skip
    logs = [r for r in written["rows"] if r[0] == "shop clean-0"]
    assert [(r[1], r[2], r[3]) for r in logs] == [(d["day"], d["verdict"], (d["progressive"] or {}).get("auc"))
                                                  for d in clean]  # fmt: skip
